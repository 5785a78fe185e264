"""Config fields that are flags (:func:`flag`, :func:`unset`) and the check naming a flag
(:func:`check_field`), for the frozen config dataclasses of the command lines.

Standard library only: light modules declare their command's config with them without importing
more than they did (``uniclr_tf.export`` serves ``export/client.py`` with NumPy alone).
:mod:`uniclr_tf.config.train_config` re-exports ``flag`` and ``unset``; :mod:`uniclr_tf.config.flagutil` defines the
flags from the fields and builds the config from the parsed flags.
"""

import dataclasses

from uniclr_tf.config.errors import UsageError


def flag(default, help, *, kind=None, many=False, choices=None):  # noqa: A002 - the flag's help
    """A config field that is a flag of the same name: its ``default``, its ``--help`` text, and
    (:mod:`uniclr_tf.config.flagutil`) ``kind``, the flag's type where the default does not tell it (None,
    an empty tuple; of each element when ``many``: a comma-separated list), ``choices``: an enum flag."""
    metadata = {"help": help}
    if kind is not None:
        metadata.update(kind=kind, many=many)
    if choices:
        metadata["choices"] = tuple(choices)
    return dataclasses.field(default=default, metadata=metadata)


def unset(kind, help, many=False):  # noqa: A002
    """A field whose default None means "the method's (or recipe's) value", or "not given" (a flag
    the command requires); ``kind`` is the type of its flag (of each element when ``many``)."""
    return flag(None, help, kind=kind, many=many)


def check_field(cfg, ok, field, expected):
    """Unless ``ok``: a :class:`UsageError` naming the flag, ``--field: expected ...; received
    <its value>`` (``not given`` when the value is None: a required flag left out)."""
    if not ok:
        value = getattr(cfg, field)
        received = "not given" if value is None else f"received {value!r}"
        raise UsageError(f"--{field}: expected {expected}; {received}")
