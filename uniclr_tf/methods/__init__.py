"""The method registry: ``--method=NAME`` → a :class:`~uniclr_tf.methods.base.Method` subclass.

Adding a method takes one file in this folder (a ``Method`` subclass: loss, terms, heads, target,
state, views, options), one line below, and one flagfile ``configs/methods/NAME.flags`` (its
paper's small-data recipe). The registry-driven tests (``tests/test_methods.py``) then train it on
both backends, compile it with XLA, check its targets get no gradient, its loss on a collapsed
batch, its two-replica parity and its export, with no new test code.
"""

import importlib

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

__all__ = ["COMMON_OPTIONS", "Method", "Option", "REGISTRY", "create", "get", "names", "option_specs"]


def names():
    return tuple(REGISTRY)


def get(name):
    """The ``Method`` subclass registered as ``name``."""
    if name not in REGISTRY:
        raise UsageError(f"--method: expected one of {names()}; received {name!r}")
    module, cls = REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"uniclr_tf.methods.{module}"), cls)


def create(name, **options):
    """An instance of method ``name`` with ``options`` (None values keep the method's defaults)."""
    return get(name)(**options)


def option_specs():
    """Every option any registered method takes: ``{name: Option}`` (one flag each)."""
    specs = dict(COMMON_OPTIONS)
    for name in REGISTRY:
        specs.update(get(name).option_specs)
    return {k: v for k, v in specs.items() if any(k in get(n).defaults for n in REGISTRY)}
