"""One training job over the GPUs of this machine as one process per GPU (JAX multi-controller).

    python -m uniclr_tf.launch [--processes=N] -- --flagfile=configs/simtrace.flags --batch_size=2048
    uniclr-launch [--processes=N] -- ...          (the same, installed)

Starts N copies of ``python -m uniclr_tf.train`` with the arguments after ``--``, each with
``CUDA_VISIBLE_DEVICES`` set to one GPU and ``--strategy=data_parallel --num_processes=N
--process_id=i --coordinator_address=127.0.0.1:PORT`` added: the job of ``--num_processes`` without
writing its N command lines. ``--batch_size`` is the global batch, as with one process.

Why: one JAX process driving several GPUs is host-bound (each GPU's enqueuing thread waits on the
others), so one process per GPU scales better (docs/results/scaling.md).

Process 0 writes to this terminal; process i's output goes to ``<log_dir>/process-<i>.log``. The
processes run in their own session, so a SIGTERM or SIGINT to this launcher (or to its process
group, as schedulers send) reaches each once, through the launcher, and the job stops at one step
with a backup (rerun the same command to resume). If one process fails, the others are stopped
(they would wait for it for ever) and the launcher exits with the failed process's status.

``--cpu_binding=gpu`` binds each process to an equal share of the CPUs of its GPU's NUMA node (sysfs's
``local_cpulist``), ``split`` to an equal share of the launcher's own CPUs; off by default.

A job never outlives its launcher: a process still running ``--stop_timeout`` seconds after the
signal (one hung in a collective never reaches the agreed step) is killed, Ctrl-C a second time
kills every process at once, and on Linux each process is killed when the launcher dies (a
``SIGKILL``, e.g. from ``timeout --kill-after``), instead of running on as an orphan that holds its GPU.
A repeated SIGTERM changes nothing: ``timeout`` and schedulers deliver one signal more than once.
"""

import argparse
import ctypes
import errno
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from uniclr_tf.training import stop_signals

#: Flags the launcher sets for every process; given after ``--`` they are an error.
OWN_FLAGS = ("--num_processes", "--process_id", "--coordinator_address")


def visible_gpus():
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else those ``nvidia-smi -L``
    lists (no GPU framework is imported here: the parent would hold memory on every GPU)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def ephemeral_ports(path="/proc/sys/net/ipv4/ip_local_port_range"):
    """``(low, high)``: the ports the kernel gives connections of their own (Linux's ``ip_local_port_range``;
    elsewhere IANA's 49152-65535)."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


def port_is_free(port):
    """Whether a server could listen on ``port`` on every interface, IPv4 and (where there is one) IPv6, as
    JAX's coordinator does (``[::]:PORT``)."""
    families = [(socket.AF_INET, "0.0.0.0")] + ([(socket.AF_INET6, "::")] if socket.has_ipv6 else [])
    for family, host in families:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, port))
        except OSError as e:
            if family == socket.AF_INET6 and e.errno in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                continue  # no IPv6 on this machine
            return False
    return True


def free_port(tries=200, rng=None):
    """A port for the job's coordinator: free on every interface now, and outside the kernel's ephemeral
    range, so that no connection opened in the seconds before the coordinator starts listening (those of
    a job that just ended, in TIME_WAIT, say) can take it: a port the kernel picked from that range was seen
    taken by then ("Failed to start RPC server ... Address already in use")."""
    rng = rng or random.SystemRandom()
    low, high = ephemeral_ports()
    ranges = [(r0, r1) for r0, r1 in ((10000, low - 1), (high + 1, 65535)) if r1 - r0 >= 1000]
    for _ in range(tries if ranges else 0):
        r0, r1 = rng.choice(ranges)
        port = rng.randint(r0, r1)
        if port_is_free(port):
            return port
    with socket.socket() as s:  # no range outside the ephemeral one, or none free there: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_cpulist(text):
    """The CPU numbers of a Linux CPU list (``"0-3,8,10-11"``, as sysfs's ``local_cpulist``)."""
    cpus = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return cpus


def gpu_local_cpus(gpus):
    """``{gpu: [cpus]}``: the CPUs of each GPU's NUMA node (sysfs's ``local_cpulist`` of its PCI device,
    found through ``nvidia-smi``); ``{}`` when that cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    local = {}
    for line in out.splitlines():
        index, _, bus = (x.strip() for x in line.partition(","))
        if index not in gpus:
            continue
        bus = bus.lower()[-12:]  # "00000000:18:00.0" -> sysfs's "0000:18:00.0"
        try:
            with open(f"/sys/bus/pci/devices/{bus}/local_cpulist") as f:
                local[index] = parse_cpulist(f.read())
        except (OSError, ValueError):
            return {}
    return local if len(local) == len(gpus) else {}


def cpu_sets(processes, available, local=None, gpus=()):
    """Disjoint CPU sets, one a process: each process gets an equal share of the CPUs of its GPU's NUMA
    node (``local``: ``{gpu: [cpus]}``) shared with the other processes of that node, or, without
    ``local``, an equal share of ``available`` in order. ``None`` where a process would get no CPU."""
    available = sorted(available)
    if local and gpus:
        allowed, groups = set(available), {}
        for i in range(processes):
            key = tuple(c for c in local[gpus[i]] if c in allowed)
            groups.setdefault(key, []).append(i)
        sets = [None] * processes
        for cpus, members in groups.items():
            for k, i in enumerate(members):
                share = list(cpus[k * len(cpus) // len(members):(k + 1) * len(cpus) // len(members)])
                sets[i] = share or None
        if all(sets):
            return sets
    sets = [available[i * len(available) // processes:(i + 1) * len(available) // processes] for i in range(processes)]
    return sets if all(sets) else [None] * processes


def commands(train_args, processes, gpus, port):
    """``[(argv, extra environment)]`` of the job's processes."""
    for flag in OWN_FLAGS:
        if any(a == flag or a.startswith(flag + "=") for a in train_args):
            raise SystemExit(f"uniclr_tf.launch: {flag} is set by the launcher; leave it out of the training flags")
    if not any(a.startswith("--strategy") for a in train_args):
        train_args = [*train_args, "--strategy=data_parallel"]
    out = []
    for i in range(processes):
        env = {"KERAS_BACKEND": "jax", **({"CUDA_VISIBLE_DEVICES": gpus[i]} if gpus else {})}
        out.append(([sys.executable, "-m", "uniclr_tf.train", *train_args, f"--num_processes={processes}",
                     f"--process_id={i}", f"--coordinator_address=127.0.0.1:{port}"], env))
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    ours, train_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(prog="python -m uniclr_tf.launch", description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=0,
                        help="processes (one GPU each; 0: one per visible GPU). On a machine without GPUs each "
                             "process gets the CPU (for tests)")
    parser.add_argument("--port", type=int, default=0, help="the coordinator's port on 127.0.0.1 (0: a free one)")
    parser.add_argument("--stop_timeout", type=float, default=300.0,
                        help="seconds the processes get to stop at one step after a SIGTERM or SIGINT before they are "
                             "killed (0: wait for ever); Ctrl-C a second time kills them at once")
    parser.add_argument("--cpu_binding", choices=("none", "gpu", "split"), default="none",
                        help="bind each process to CPUs of its own: 'gpu' an equal share of its GPU's NUMA node "
                             "(else as 'split'), 'split' an equal share of this launcher's CPUs in order")
    parser.add_argument("--log_dir", default="", help="where process i > 0 writes its output (default: a new "
                                                      "temporary folder, printed)")
    args = parser.parse_args(ours)
    if args.stop_timeout < 0:
        parser.error(f"--stop_timeout={args.stop_timeout:g}: seconds >= 0 (0: wait for ever)")
    backend = os.environ.get("KERAS_BACKEND", "jax")
    if backend != "jax":
        parser.error(f"KERAS_BACKEND={backend}: the launcher starts a JAX multi-controller job; on TensorFlow use "
                     "one process with --strategy=mirrored, or --strategy=multi_worker")
    gpus = visible_gpus()
    processes = args.processes or len(gpus)
    if processes < 1:
        parser.error("no GPU is visible (CUDA_VISIBLE_DEVICES, nvidia-smi): give --processes")
    if gpus and processes > len(gpus):
        parser.error(f"--processes={processes}: only {len(gpus)} GPUs are visible ({','.join(gpus)})")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="uniclr-launch-")
    os.makedirs(log_dir, exist_ok=True)
    jobs = commands(train_args, processes, gpus[:processes] if gpus else [], args.port or free_port())
    print(f"launch: {processes} processes" + (f" on GPUs {','.join(gpus[:processes])}" if gpus else "")
          + f"; processes 1..{processes - 1} write to {log_dir}/process-<i>.log", flush=True)
    sets = [None] * processes
    if args.cpu_binding != "none" and hasattr(os, "sched_getaffinity"):
        local = gpu_local_cpus(gpus[:processes]) if args.cpu_binding == "gpu" and gpus else {}
        sets = cpu_sets(processes, os.sched_getaffinity(0), local, gpus[:processes])
        print("launch: CPUs " + "; ".join(f"process {i}: {_cpulist(c)}" for i, c in enumerate(sets)), flush=True)
    procs, logs = [], []
    for i, (cmd, env) in enumerate(jobs):
        out = None if i == 0 else open(os.path.join(log_dir, f"process-{i}.log"), "w")
        logs.append(out)
        procs.append(start(cmd, cpus=sets[i], env={**os.environ, **env}, stdout=out,
                           stderr=subprocess.STDOUT if out else None))
    job = Job(procs, stop_timeout_s=args.stop_timeout)
    previous = {s: signal.signal(s, job.forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return job.wait()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for f in logs:
            if f is not None:
                f.close()


def _cpulist(cpus):
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (``"all"`` for ``None``)."""
    if not cpus:
        return "all"
    runs, first = [], None
    for k, c in enumerate(cpus):
        if first is None:
            first = c
        if k + 1 == len(cpus) or cpus[k + 1] != c + 1:
            runs.append(f"{first}-{c}" if c != first else f"{c}")
            first = None
    return ",".join(runs)


def _die_with_parent(parent):
    """``Popen``'s ``preexec_fn`` (Linux): have the kernel SIGKILL this child when ``parent`` dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os.kill(os.getpid(), signal.SIGKILL)


def start(cmd, cpus=None, **popen_kwargs):
    """One process of the job: in a session of its own (a signal to the launcher's process group reaches
    it once, through :meth:`Job.forward`), on Linux killed by the kernel when the launcher dies, and
    bound to ``cpus`` when given (``os.sched_setaffinity``, inherited by all its threads)."""
    parent = os.getpid()

    def setup():
        _die_with_parent(parent)
        if cpus:
            os.sched_setaffinity(0, cpus)

    linux = sys.platform.startswith("linux")
    return subprocess.Popen(cmd, start_new_session=True, **({"preexec_fn": setup} if linux else {}), **popen_kwargs)


class Job:
    """The job's processes: forwards the launcher's signals to them and waits for them, killing those that
    cannot end on their own (the stop and failure rules in the module's docstring)."""

    def __init__(self, procs, stop_timeout_s=300.0, failure_grace_s=60.0):
        self.procs = procs
        self.stop_timeout_s = stop_timeout_s
        self.failure_grace_s = failure_grace_s
        self.first_signal = stop_signals.FirstSignal()
        self.killed = set()  # indices of the processes sent SIGKILL

    def forward(self, signum, frame=None):
        """The signal handler: the first SIGTERM/SIGINT goes to every running process (they agree on a
        step to stop at and back up); a second Ctrl-C kills them; a repeated signal is ignored
        (:mod:`uniclr_tf.training.stop_signals`)."""
        seen = self.first_signal.receive(signum)
        if seen == "again":
            self._kill("Ctrl-C a second time")
        if seen != "first":
            return
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signum)

    def _kill(self, why):
        for i, p in enumerate(self.procs):
            if p.poll() is None and i not in self.killed:
                print(f"launch: killing process {i} ({why})", flush=True)
                p.kill()
                self.killed.add(i)

    def wait(self):
        """The job's exit status: 0 if every process ended with 0, else the first failure's (a process
        that fails leaves the others waiting for it: they are killed after ``failure_grace_s`` seconds;
        processes still running ``stop_timeout_s`` seconds after a signal are killed too)."""
        failed_at = None
        while any(p.poll() is None for p in self.procs):
            now = time.monotonic()
            if failed_at is None and any(p.returncode not in (None, 0) for p in self.procs):
                failed_at = now
            if failed_at is not None and now - failed_at > self.failure_grace_s:
                self._kill("a failed process left it waiting")
            signalled_at = self.first_signal.at
            if signalled_at is not None and self.stop_timeout_s and now - signalled_at > self.stop_timeout_s:
                self._kill(f"not stopped {self.stop_timeout_s:g} s after the signal; hung in a collective?")
            time.sleep(0.2)
        codes = [p.returncode if p.returncode >= 0 else 128 - p.returncode for p in self.procs]  # -9: killed, 137
        for i, c in enumerate(codes):
            if c:
                print(f"launch: process {i} exited with {c}", flush=True)
        return next((c for c in codes if c), 0)


def entry_point():
    sys.exit(main())


if __name__ == "__main__":
    entry_point()
