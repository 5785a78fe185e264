"""Flags from a frozen config dataclass: one flag per field, same name, same default.

Only entry points call these (``train``, ``linear_eval``, ``finetune``, ``export``, ``autotune``,
``tools.release``, ``tools.folder_to_tfrecord``): library code never reads flags. The dataclass
validates itself, so a bad value stops with a message naming the flag. A field's help text is its
metadata's ``"help"`` and an enum flag's values its ``"choices"``, both declared next to the field
with ``config.flag`` (:mod:`uniclr_tf.config.fields`). A field whose default is None (``config.unset``) or
an empty tuple declares its flag's type in its metadata (``"kind"``, ``"many"``); a None default
means "not given". A field whose type is itself a dataclass (a sub-config, e.g.
``TrainConfig.data``) is no flag: its fields are, under their own names
(:func:`leaf_fields`), and the config is built by its ``from_flat`` from the flat flag values.
"""

import dataclasses
import sys

from absl import app, flags

from uniclr_tf.config.errors import UsageError

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
    if field.default is None or "kind" in field.metadata:
        return field.metadata["kind"], field.metadata.get("many", False)
    if isinstance(field.default, tuple):
        return type(field.default[0]), True
    return type(field.default), False


def is_section(field):
    """Whether a dataclass field holds a sub-config (a dataclass) rather than a flag's value."""
    return isinstance(field.type, type) and dataclasses.is_dataclass(field.type)


def leaf_fields(config_cls):
    """The fields of ``config_cls`` that are flags, in declaration order, those of each sub-config in
    its place; a field whose metadata says ``"flag": False`` is none."""
    for field in dataclasses.fields(config_cls):
        if is_section(field):
            yield from leaf_fields(field.type)
        elif field.metadata.get("flag", True):
            yield field


def section_groups(config_cls):
    """``--help``'s groups of a config of sub-configs: ``[(title, [flag names])]``, one per sub-config
    (its ``TITLE``) and one per flag of ``config_cls`` itself (titled by its name), in declaration order."""
    groups = []
    for field in dataclasses.fields(config_cls):
        if is_section(field):
            groups.append((getattr(field.type, "TITLE", "") or field.name, [f.name for f in leaf_fields(field.type)]))
        elif field.metadata.get("flag", True):
            groups.append((field.name, [field.name]))
    return groups


def define_flags(config_cls, flag_values=None, skip=()):
    """Defines one absl flag per field of ``config_cls`` (:func:`leaf_fields`) but those in ``skip``,
    its help and (an enum) its choices from the field's metadata (``config.flag``)."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    for field in leaf_fields(config_cls):
        if field.name in skip:
            continue
        kind, many = _kind(field)
        define_flag(field.name, field.default, kind, field.metadata["help"], flag_values, many=many,
                    choices=field.metadata.get("choices"))


def parse_list(name, value, kind):
    """A list flag's strings as a tuple of ``kind``, with an error naming the flag."""
    try:
        return tuple(kind(v) for v in value)
    except ValueError:
        raise UsageError(f"--{name}: expected comma-separated numbers; received {','.join(value)!r}") from None


def config_values(config_cls, flag_values=None, skip=()):
    """The parsed flags of ``config_cls``'s fields as a dict; list flags become tuples."""
    flag_values = flags.FLAGS if flag_values is None else flag_values
    values = {}
    for field in leaf_fields(config_cls):
        if field.name in skip:
            continue
        value = flag_values[field.name].value
        kind, many = _kind(field)
        if many and value is not None:
            value = parse_list(field.name, value, kind)
        values[field.name] = value
    return values


def config_from_flags(config_cls, flag_values=None):
    """Builds ``config_cls`` from the parsed flags (by its ``from_flat`` when it has sub-configs)."""
    values = config_values(config_cls, flag_values)
    return config_cls.from_flat(values) if hasattr(config_cls, "from_flat") else config_cls(**values)


def config_or_exit(config_cls, flag_values=None):
    """:func:`config_from_flags` in a ``main``: a bad or missing flag (``UsageError``) stops the
    command with one ``error: --flag: ...`` line, exit code 1, no traceback."""
    try:
        return config_from_flags(config_cls, flag_values)
    except UsageError as e:
        sys.exit(f"error: {e}")


def group_fields(config_cls, markers):
    """``[(title, [field names])]``: each field of ``config_cls`` (in declaration order) goes under the
    title of the last marker ``(title, first field)`` at or before it."""
    starts = {first: title for title, first in markers}
    groups, title = [], None
    for field in dataclasses.fields(config_cls):
        if field.name in starts or title is None:
            title = starts.get(field.name, "other")
            groups.append((title, []))
        groups[-1][1].append(field.name)
    return groups


def _default_text(flag):
    value = flag.default
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return repr(value) if isinstance(value, str) else str(value)


def grouped_help(doc, groups, flag_values=None, width=100):
    """The ``--help`` text: ``doc``, then each group's flags with their defaults, choices and help
    (``groups``: ``[(title, [flag names])]``; names not defined are skipped); aliases beside their
    flags. ``--helpfull`` still gives absl's full listing."""
    import textwrap
    flag_values = flags.FLAGS if flag_values is None else flag_values
    aliases = {}
    for name, flag in flag_values._flags().items():
        target = getattr(flag, "_alias_for", None) or getattr(getattr(flag, "parser", None), "_alias_for", None)
        if name != flag.name:  # absl registers an alias as another name of the same flag object
            aliases.setdefault(flag.name, []).append(name)
        elif target:
            aliases.setdefault(target, []).append(name)
    lines = [doc.strip(), ""]
    for title, names in groups:
        present = [n for n in names if n in flag_values]
        if not present:
            continue
        lines.append(f"{title}:")
        for name in present:
            flag = flag_values[name]
            head = f"  --{name}={_default_text(flag)}"
            also = f" Alias: {', '.join('--' + a for a in aliases.get(name, []))}." if aliases.get(name) else ""
            text = (flag.help or "").strip() + also  # an enum's help starts with <its|values>
            lines.append(head)
            lines += textwrap.wrap(text, width, initial_indent="      ", subsequent_indent="      ")
        lines.append("")
    lines.append("--helpfull lists every flag, absl's own included.")
    return "\n".join(lines)


_HELP_ARGS = ("--help", "-help", "-h", "--helpshort", "-?", "--?")


def _refusing_stray_arguments(main):
    """``main`` behind the check every CLI of the package makes first: absl passes the words left
    after the flags (``argv[1:]``), and none of our CLIs takes any, so a stray word (a flag with its
    ``--`` forgotten, a path without ``--run_dir=``) is a usage error naming it rather than ignored."""
    def checked(argv):
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
        return main(argv)
    return checked


def run_cli(module_name, doc, main, groups=None, words=False):
    """Runs ``main`` with absl, as the ``python -m`` form and the console scripts of pyproject.toml do
    (the flags must be defined already). ``--help`` prints ``doc`` and the flags by group (``groups``:
    ``[(title, [flag names])]``; default: the module's own flags) with their defaults, and exits 0;
    ``--helpfull`` is absl's listing. Words left after the flags are refused (a usage error), unless
    ``words`` (a CLI that takes a command and paths, as ``uniclr_tf.training.autotune``): ``main`` gets them."""
    if any(a in _HELP_ARGS for a in sys.argv[1:]):
        if groups is None:
            names = [f.name for f in flags.FLAGS.get_key_flags_for_module(module_name)]
            names += [f.name for f in flags.FLAGS.get_key_flags_for_module(sys.argv[0])]
            groups = [("flags", sorted(set(names)))]
        print(grouped_help(doc, groups))
        sys.exit(0)
    if module_name != "__main__":
        main_module = sys.modules["__main__"]
        if not getattr(main_module, "__doc__", None):
            main_module.__doc__ = doc
        for flag in flags.FLAGS.get_key_flags_for_module(module_name):
            flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    try:
        app.run(main if words else _refusing_stray_arguments(main))
    except SystemExit as e:
        asked = any(a.lstrip("-").split("=")[0] in ("help", "?", "helpshort", "helpfull") for a in sys.argv[1:])
        if e.code == 1 and asked and not flags.FLAGS.is_parsed():
            sys.exit(0)
        raise
