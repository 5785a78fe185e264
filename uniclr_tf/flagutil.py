"""Flags from a frozen config dataclass: one flag per field, same name, same default.

Only entry points call these (``train``, ``linear_eval``): library code never reads flags. The
dataclass validates itself, so a bad value stops with a message naming the flag.
"""

import dataclasses

from absl import flags


def define_flags(config_cls, help_texts, enums=None, flag_values=None):
    """Defines one absl flag per field of ``config_cls`` (enum for names in ``enums``)."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    enums = enums or {}
    for field in dataclasses.fields(config_cls):
        name, default, help_ = field.name, field.default, help_texts[field.name]
        if name in enums:
            flags.DEFINE_enum(name, default, enums[name], help_, flag_values=flag_values)
        elif isinstance(default, bool):
            flags.DEFINE_bool(name, default, help_, flag_values=flag_values)
        elif isinstance(default, int):
            flags.DEFINE_integer(name, default, help_, flag_values=flag_values)
        elif isinstance(default, float):
            flags.DEFINE_float(name, default, help_, flag_values=flag_values)
        elif isinstance(default, tuple):
            flags.DEFINE_list(name, [str(v) for v in default], help_, flag_values=flag_values)
        else:
            flags.DEFINE_string(name, default, help_, flag_values=flag_values)


def config_from_flags(config_cls, flag_values=None):
    """Builds ``config_cls`` from the parsed flags; list flags become tuples of the default's type."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    values = {}
    for field in dataclasses.fields(config_cls):
        value = flag_values[field.name].value
        if isinstance(field.default, tuple):
            caster = float if isinstance(field.default[0], float) else int
            try:
                value = tuple(caster(v) for v in value)
            except ValueError:
                raise ValueError(f"--{field.name}: expected comma-separated numbers; received {','.join(value)!r}")
        values[field.name] = value
    return config_cls(**values)
