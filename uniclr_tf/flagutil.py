"""Flags from a frozen config dataclass: one flag per field, same name, same default.

Only entry points call these (``train``, ``linear_eval``): library code never reads flags. The
dataclass validates itself, so a bad value stops with a message naming the flag. A field whose
default is None (``config.unset``) declares its flag's type in its metadata; its flag defaults to
None, meaning "not given".
"""

import dataclasses
import sys

from absl import app, flags

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float, str: flags.DEFINE_string}


def define_flag(name, default, kind, help_, flag_values, many=False, choices=None):
    """One absl flag: an enum when ``choices``, a comma-separated list when ``many``."""
    if choices:
        flags.DEFINE_enum(name, default, choices, help_, flag_values=flag_values)
    elif many:
        flags.DEFINE_list(name, None if default is None else [str(v) for v in default], help_, flag_values=flag_values)
    else:
        _DEFINE[kind](name, default, help_, flag_values=flag_values)


def _kind(field):
    if field.default is None:
        return field.metadata["kind"], field.metadata.get("many", False)
    if isinstance(field.default, tuple):
        return type(field.default[0]), True
    return type(field.default), False


def define_flags(config_cls, help_texts, enums=None, flag_values=None, skip=()):
    """Defines one absl flag per field of ``config_cls`` (enum for names in ``enums``)."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    enums = enums or {}
    for field in dataclasses.fields(config_cls):
        if field.name in skip:
            continue
        kind, many = _kind(field)
        define_flag(field.name, field.default, kind, help_texts[field.name], flag_values, many=many,
                    choices=enums.get(field.name))


def parse_list(name, value, kind):
    """A list flag's strings as a tuple of ``kind``, with an error naming the flag."""
    try:
        return tuple(kind(v) for v in value)
    except ValueError:
        raise ValueError(f"--{name}: expected comma-separated numbers; received {','.join(value)!r}") from None


def config_values(config_cls, flag_values=None, skip=()):
    """The parsed flags of ``config_cls``'s fields as a dict; list flags become tuples."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    values = {}
    for field in dataclasses.fields(config_cls):
        if field.name in skip:
            continue
        value = flag_values[field.name].value
        kind, many = _kind(field)
        if many and value is not None:
            value = parse_list(field.name, value, kind)
        values[field.name] = value
    return values


def config_from_flags(config_cls, flag_values=None):
    """Builds ``config_cls`` from the parsed flags."""
    return config_cls(**config_values(config_cls, flag_values))


def run_cli(module_name, doc, main):
    """Runs ``main`` with absl, as the ``python -m`` form and the console scripts of pyproject.toml do
    (the flags must be defined already). Under a console script, ``--help`` shows the module's
    docstring and flags as ``python -m`` does; asking for help exits 0 (absl exits 1)."""
    if module_name != "__main__":
        main_module = sys.modules["__main__"]
        if not getattr(main_module, "__doc__", None):
            main_module.__doc__ = doc
        for flag in flags.FLAGS.get_key_flags_for_module(module_name):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    try:
        app.run(main)
    except SystemExit as e:
        asked = any(a.lstrip("-").split("=")[0] in ("help", "?", "helpshort", "helpfull") for a in sys.argv[1:])
        if e.code == 1 and asked and not flags.FLAGS.is_parsed():
            sys.exit(0)
        raise
