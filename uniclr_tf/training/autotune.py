"""XLA's GPU autotuning results, shipped per card, so a first run does not time every kernel again.

Most of a ResNet-18 train step's first XLA compile on a GPU is autotuning: XLA times the candidate
algorithms of every convolution and matrix product and keeps the fastest. XLA can keep those results in a folder, one small file per fused kernel, keyed by
the kernel's HLO and the card (compute capability, cores, clock, memory bandwidth, L2 size, cuDNN
version); JAX's persistent compilation cache turns that folder on, as
``<cache>/xla_gpu_per_fusion_autotune_cache_dir``. A second run on a machine finds its results
there; a first run on a fresh machine times everything again.

This module ships those results: ``uniclr_tf/training/autotune_tables/jaxlib-<version>.json`` holds the
autotuning results of the shipped GPU configurations on the cards they were measured on (the table
says which). Before the first compile, :func:`seed` copies the entries of the card in use into the
cache folder, never replacing a file there. A card, kernel or jaxlib version the table lacks is
tuned as before: a table entry can only save time, never change which kernels XLA may choose
among. XLA leaves version checks to its user ("use different directories for different XLA
versions"), so a table is used only by the jaxlib version that wrote it.

Make or extend a table on a GPU machine from the caches of runs made there
(``bash benchmarks/speed.sh autotune_table`` runs the shipped configurations and does this)::

    python -m uniclr_tf.training.autotune collect CACHE_DIR [CACHE_DIR ...] [--table=PATH] [--configs=NAMES]
    python -m uniclr_tf.training.autotune list [--table=PATH]
"""

import base64
import dataclasses
import datetime
import json
import os
import socket
import sys

from uniclr_tf.config.fields import flag

TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "autotune_tables")
SUBDIR = "xla_gpu_per_fusion_autotune_cache_dir"  # where JAX points XLA's per-fusion autotune cache
FORMAT = 1


def jaxlib_version():
    """The installed jaxlib's version, or None without JAX."""
    try:
        import jaxlib
    except ImportError:
        return None
    return jaxlib.__version__


def table_path(version=None):
    """The shipped table for a jaxlib version (default: the installed one)."""
    return os.path.join(TABLES, f"jaxlib-{version or jaxlib_version()}.json")


def load(path):
    """A table as a dict (``cards``: device folder -> {name, configs, made}; ``entries``: path -> bytes)."""
    with open(path) as f:
        table = json.load(f)
    if table.get("format") != FORMAT:
        raise ValueError(f"{path}: autotune table format {table.get('format')!r}, expected {FORMAT}")
    table["entries"] = {k: base64.b64decode(v) for k, v in table["entries"].items()}
    return table


def save(table, path):
    """Writes ``table`` to ``path`` atomically (sorted keys: a rerun with the same results changes nothing)."""
    from uniclr_tf.training.runs import atomic_write_text
    out = dict(table, entries={k: base64.b64encode(v).decode() for k, v in table["entries"].items()})
    atomic_write_text(path, json.dumps(out, indent=1, sort_keys=True) + "\n")


def _write_new(path, data):
    """Writes ``data`` to ``path`` unless it exists, through a temporary name (other processes may read).

    Not :func:`uniclr_tf.training.runs.atomic_save`: hundreds of small files are written on a machine's first run,
    and a file lost in a crash is only tuned again, so no fsync; and processes of several hosts may seed
    one shared folder, so the temporary name carries the host."""
    if os.path.exists(path):
        return False
    tmp = f"{path}.tmp-{socket.gethostname()}-{os.getpid()}"  # processes of several hosts may share the folder
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return True


def seed(cache_dir, card, table_file=None, log=print):
    """Copies the table's entries for ``card`` (a JAX ``device_kind``) into ``cache_dir``'s autotune folder.

    Returns the number of files written (0 when the table is missing, has no entries for this card,
    or they are all there already). Files already in the folder are left as they are.
    """
    table_file = table_file or table_path()
    if not os.path.exists(table_file):
        return 0
    table = load(table_file)
    folders = {d for d, c in table["cards"].items() if c["name"] == card}
    if not folders:
        return 0
    root = os.path.join(cache_dir, SUBDIR)
    written = 0
    for name, data in table["entries"].items():
        folder, _ = name.split("/", 1)
        if folder in folders:
            os.makedirs(os.path.join(root, folder), exist_ok=True)
            written += _write_new(os.path.join(root, name), data)
    if written and log:
        log(f"XLA autotuning: {written} results for {card} from {os.path.relpath(table_file)} put in {root} "
            "(the first compile does not time those kernels again)")
    return written


def seed_for_jax(cache_dir, log=print):
    """:func:`seed` for the first JAX device, when JAX's compilation cache keeps XLA's autotune results.

    Does nothing off GPUs, or when ``jax_persistent_cache_enable_xla_caches`` leaves that cache off.
    Never raises: the table only saves time.
    """
    try:
        import jax
        enabled = jax.config.jax_persistent_cache_enable_xla_caches or ""
        if jax.default_backend() != "gpu" or not (enabled == "all" or SUBDIR in enabled):
            return 0
        return seed(cache_dir, jax.devices()[0].device_kind, log=log)
    except Exception as e:  # noqa: BLE001 - an unreadable table must not stop a run
        if log:
            log(f"warning: XLA autotuning table not used ({type(e).__name__}: {e})")
        return 0


def collect(cache_dirs, table_file, card, configs=()):
    """Adds the autotune results in ``cache_dirs`` (JAX compilation caches) to ``table_file``.

    Each cache's device folders are recorded under ``card``'s name (collect on the machine that made
    them). Returns ``(new entries, total entries)``.
    """
    table = load(table_file) if os.path.exists(table_file) else {
        "format": FORMAT, "jaxlib": os.path.basename(table_file)[len("jaxlib-"):-len(".json")],
        "about": "XLA per-fusion GPU autotuning results of uniclr-tf's GPU configurations; see uniclr_tf/training/autotune.py",
        "cards": {}, "entries": {}}
    new = 0
    for cache in cache_dirs:
        root = os.path.join(cache, SUBDIR)
        if not os.path.isdir(root):
            raise FileNotFoundError(f"{cache}: no {SUBDIR} folder (was it a JAX compilation cache on a GPU?)")
        for folder in sorted(os.listdir(root)):
            info = table["cards"].setdefault(folder, {"name": card, "configs": [], "made": ""})
            if info["name"] != card:
                raise ValueError(f"{root}/{folder} is recorded for {info['name']!r}, not {card!r}")
            info["configs"] = sorted(set(info["configs"]) | set(configs))
            info["made"] = datetime.date.today().isoformat()
            for file in sorted(os.listdir(os.path.join(root, folder))):
                if not file.endswith(".pb"):  # XLA's own temporary files
                    continue
                with open(os.path.join(root, folder, file), "rb") as f:
                    data = f.read()
                key = f"{folder}/{file}"
                new += key not in table["entries"]
                table["entries"][key] = data
    os.makedirs(os.path.dirname(os.path.abspath(table_file)), exist_ok=True)
    save(table, table_file)
    return new, len(table["entries"])


@dataclasses.dataclass(frozen=True)
class AutotuneConfig:
    """The flags of one ``python -m uniclr_tf.training.autotune`` invocation (its command and cache folders are
    the words after them). Each field is a flag of the same name, declared with its help
    (:func:`uniclr_tf.config.fields.flag`); the order is ``--help``'s (:data:`HELP_GROUPS`)."""

    table: str = flag("", "collect: the table to extend; list: the table to show (default: the installed "
                          "jaxlib's).")
    card: str = flag("", "collect: the card's JAX device_kind (default: this machine's first device).")
    configs: str = flag("", "collect: comma-separated names of what the runs trained (recorded).")

    @property
    def table_file(self):
        """``--table``, else the installed jaxlib's shipped table."""
        return self.table or table_path()


#: ``--help``'s groups: ``(title, first field)`` (:func:`uniclr_tf.config.flagutil.group_fields`).
HELP_GROUPS = [("collect and list", "table"), ("collect", "card")]


def define_flags(flag_values=None):
    """One flag per ``AutotuneConfig`` field, same name, same default, the help next to the field
    (defined when the command runs, not on import)."""
    from uniclr_tf.config import flagutil
    flagutil.define_flags(AutotuneConfig, flag_values=flag_values)


def config_from_flags(flag_values=None) -> AutotuneConfig:
    from uniclr_tf.config import flagutil
    return flagutil.config_from_flags(AutotuneConfig, flag_values)


USAGE = ("usage: python -m uniclr_tf.training.autotune collect CACHE_DIR [CACHE_DIR ...] [--table=PATH] [--card=KIND] "
         "[--configs=NAMES] | list [--table=PATH]")


def _usage_error(message):
    """A usage error: the usage line and the message on stderr, exit code 2 (as argparse's)."""
    print(f"{USAGE}\nerror: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv):
    """absl's ``main``: the config from the flags, the words after them to :func:`run`."""
    from uniclr_tf.config import flagutil
    command, words = (argv[1], argv[2:]) if len(argv) > 1 else ("", [])
    return run(flagutil.config_or_exit(AutotuneConfig), command, words)


def run(cfg: AutotuneConfig, command, words):
    """``collect CACHE_DIR ...``: add the autotune results of JAX compilation caches (--compilation_cache_dir
    of runs) to a table; ``list``: the cards and entries of a table. Returns the exit code."""
    table_file = cfg.table_file
    if command == "collect":
        if not words:
            _usage_error("collect: name one or more JAX compilation cache folders")
        return _collect(words, table_file, cfg.card, cfg.configs)
    if command != "list" or words:
        _usage_error(f"expected the command collect or list; received {' '.join([command, *words]) or 'none'}")
    if not os.path.exists(table_file):
        print(f"{table_file}: no table", file=sys.stderr)
        return 1
    table = load(table_file)
    print(f"{table_file} (jaxlib {table['jaxlib']})")
    for folder, info in sorted(table["cards"].items(), key=lambda kv: kv[1]["name"]):
        count = sum(k.startswith(folder + "/") for k in table["entries"])
        print(f"  {info['name']}: {count} entries (folder {folder}, made {info['made']}; "
              f"configs: {', '.join(info['configs']) or 'not recorded'})")
    return 0


def _collect(caches, table_file, card, configs):
    if not card:
        import jax
        if jax.default_backend() != "gpu":
            _usage_error("no GPU here: pass --card=<the JAX device_kind of the card that made the caches>")
        card = jax.devices()[0].device_kind
    new, total = collect(caches, table_file, card, [s for s in configs.split(",") if s])
    print(f"{table_file}: {new} new entries for {card}, {total} in all")
    return 0


def entry_point():
    """What ``python -m uniclr_tf.training.autotune`` does."""
    from uniclr_tf.config import flagutil
    define_flags()
    flagutil.run_cli(__name__, __doc__, main, groups=flagutil.group_fields(AutotuneConfig, HELP_GROUPS), words=True)


if __name__ == "__main__":
    entry_point()
