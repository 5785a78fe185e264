"""The methods: one name per self-supervised method, each a :class:`~uniclr_tf.methods.base.Method`.

``get(name, **options)`` returns a configured method to hand to :class:`uniclr_tf.UniCLR` (or to
call on embeddings yourself); ``names()`` lists the names; ``get_class(name)`` is the class, with
its declarations (``defaults``, ``terms``, ``predictor``, ``target``, ``views``).

Examples:
    >>> from uniclr_tf import methods
    >>> methods.names()[:3]
    ('simaffinity', 'simwhitening', 'simtrace')
    >>> methods.get("simaffinity", temperature=0.2).options["temperature"]
    0.2

Adding a method takes one file in this folder (a ``Method`` subclass: loss, terms, heads, target,
state, views, options), one line in ``REGISTRY``, and one flagfile ``configs/methods/NAME.flags``
(its paper's small-data recipe). The registry-driven tests (``tests/test_methods.py``) then train
it on both backends, compile it with XLA, check its targets get no gradient, its loss on a
collapsed batch, its two-replica parity and its export, with no new test code.
"""

import importlib
import re

from uniclr_tf.config.errors import UsageError
from uniclr_tf.methods.base import COMMON_OPTIONS, Method, Option

# name -> "module:Class" (imported on first use).
REGISTRY = {
    "simaffinity": "uniclr:SimAffinity",
    "simwhitening": "uniclr:SimWhitening",
    "simtrace": "uniclr:SimTrace",
    "simclr": "simclr:SimCLR",
    "moco_v2": "moco_v2:MoCoV2",
    "moco_v3": "moco_v3:MoCoV3",
    "byol": "byol:BYOL",
    "simsiam": "simsiam:SimSiam",
    "barlow_twins": "barlow_twins:BarlowTwins",
    "vicreg": "vicreg:VICReg",
    "wmse": "wmse:WMSE",
    "co2": "co2:CO2",
    "swav": "swav:SwAV",
    "dino": "dino:DINO",
    "zero_cl": "zero_cl:ZeroCL",
}

__all__ = ["COMMON_OPTIONS", "Method", "Option", "REGISTRY", "create", "get", "get_class", "names", "option_specs"]


def names():
    """The registered method names, in the registry's order (the three UniCLR objectives first).

    Examples:
        >>> "simtrace" in names() and "byol" in names()
        True
    """
    return tuple(REGISTRY)


def get_class(name):
    """The ``Method`` subclass registered as ``name`` (its declarations: ``defaults``, ``terms``, ...).

    Examples:
        >>> get_class("byol").defaults
        {'ema_momentum': 0.99}
    """
    if not isinstance(name, str) or name not in REGISTRY:
        raise UsageError(f"--method: expected one of {names()}; received {name!r}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"uniclr_tf.methods.{module}"), cls)


def get(name, **options):
    """Method ``name`` configured with ``options`` (None values keep the method's defaults).

    Raises ``ValueError`` for an unknown name or a bad option value, and ``TypeError`` for an option
    that the method does not take (the message lists those it takes).

    Examples:
        >>> simtrace = get("simtrace", eps=1e-3)
        >>> simtrace.options["eps"], simtrace.terms
        (0.001, ('trace',))
    """
    if isinstance(name, Method):
        if options:
            raise TypeError(f"methods.get: pass the options to {type(name).__name__}(...), not next to an instance")
        return name
    if not isinstance(name, str) or name not in REGISTRY:
        raise ValueError(f"method: expected one of {names()}; received {name!r}")
    cls = get_class(name)
    unknown = sorted(k for k, v in options.items() if v is not None and k not in cls.defaults)
    if unknown:
        takes = ", ".join(sorted(cls.defaults)) or "no options"
        raise TypeError(f"method {name!r} does not take the option {unknown[0]!r}; it takes {takes}")
    try:
        return cls(**options)
    except UsageError as e:  # phrased for the train CLI's flags: named here as the Python arguments
        message = re.sub(r"--(\w+)", r"\1", re.sub(r"--method=(\w+)", r"method '\1'", str(e)))
        raise ValueError(message) from None


def create(name, **options):
    """An instance of method ``name`` with ``options`` (None values keep the method's defaults); an
    option the method does not take is a ``ValueError`` phrased for the train CLI's flags."""
    return get_class(name)(**options)


def option_specs():
    """Every option any registered method takes: ``{name: Option}`` (one flag each)."""
    specs = dict(COMMON_OPTIONS)
    for name in REGISTRY:
        specs.update(get_class(name).option_specs)
    return {k: v for k, v in specs.items() if any(k in get_class(n).defaults for n in REGISTRY)}
