"""Child processes without the import: ``python -m MODULE ARGS`` and ``python -c CODE ARGS`` forked
from an interpreter that has already imported TensorFlow, Keras and the package.

A test that starts the train CLI or a snippet in a child process pays ~5 s of CPU for
``import tensorflow`` (which also imports JAX, scikit-learn and Matplotlib through Keras) before
the child does anything; the suite starts a few hundred. Here one *warm* interpreter per backend
and pytest worker does those imports once; each :func:`popen` sends it the command, the
environment, the working directory and three pipe ends, and it forks a child that sets them up
and runs the module or the code as ``python`` would (``__main__``, ``sys.argv``, ``sys.path[0]``,
exit codes, ``atexit``, an uncaught ``KeyboardInterrupt`` ending by SIGINT). The child is a real
process with its own pid: signals, ``kill -9``, pipes and files behave as for a child started by
:mod:`subprocess`; its exit status comes back through the warm interpreter.

What cannot be the same, and so is started by :mod:`subprocess` as before (``popen`` decides):
code that looks at ``sys.modules`` or hides modules from import (a JAX-only machine, a cheap
``import uniclr_tf``), an environment that differs from the warm interpreter's in anything read at import (only
``XLA_FLAGS``, ``TF_CPP_MIN_LOG_LEVEL``, ``TF_CONFIG``, ``PYTHONUNBUFFERED``, ``CUDA_VISIBLE_DEVICES``, ``UNICLR_*``
and ``PYTHONPATH`` entries it already has may differ), another interpreter or a command that is
not ``python -m`` / ``python -c``, a module already imported by the warm interpreter, and any
call while ``UNICLR_TESTS_COLD=1`` (every child cold, as before: for comparing), and a child whose own
environment sets it (a test that needs a process without the package imported).
"""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Imported once by each warm interpreter: what the CLIs and the snippets import, and what a run imports
#: on first use (its pictures, TensorBoard, the export; ~0.5 s of CPU a run). Not the entry points
#: themselves (``python -m`` must run them as ``__main__``). Importing starts no backend.
PRELOAD = ("numpy", "tensorflow", "keras", "h5py", "absl.flags", "uniclr_tf.config.train_config",
           "uniclr_tf.methods", "uniclr_tf.objectives", "uniclr_tf.nets.model", "uniclr_tf.nets.encoders",
           "uniclr_tf.data", "uniclr_tf.augment", "uniclr_tf.training.cli", "uniclr_tf.training.callbacks",
           "uniclr_tf.training.backup", "uniclr_tf.training.runs", "uniclr_tf.evaluation",
           "uniclr_tf.evaluation.run", "uniclr_tf.evaluation.pictures", "uniclr_tf.serving.export",
           "uniclr_tf.training.distribute", "matplotlib.figure", "matplotlib.backends.backend_agg", "PIL.Image",
           "sklearn.manifold", "tensorboard.summary", "tensorboard.plugins.projector")

#: May differ between a child's environment and the warm interpreter's: read after start-up (and
#: ``KERAS_BACKEND``, which chose the interpreter). ``PYTHONPATH`` may name folders it already has.
#: ``TPU_SKIP_MDS_QUERY``: JAX sets it in a process that starts its backends (a test's, in pytest's
#: own process), and reads it only then.
FREE_ENV = ("KERAS_BACKEND", "XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL", "TF_CONFIG", "PYTHONUNBUFFERED",
            "CUDA_VISIBLE_DEVICES", "TPU_SKIP_MDS_QUERY")

SERVER = r"""
import atexit, io, json, os, runpy, signal, socket, sys, threading, traceback, types
sock = socket.socket(fileno=int(sys.argv[1]))
for name in json.loads(sys.argv[2]):
    __import__(name)
# Nothing may have started a backend: a child must still be able to choose devices and flags.
if "jax" in sys.modules:
    from jax._src import xla_bridge
    assert not xla_bridge._backends, "a JAX backend started while importing"
if "tensorflow" in sys.modules:
    from tensorflow.python.eager import context
    assert not context.context()._initialized, "TensorFlow's context started while importing"
print(json.dumps({"modules": sorted(sys.modules), "path": sys.path}), flush=True)


def child(request, fds):
    sock.close()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for name in ("SIGTERM", "SIGCHLD", "SIGPIPE", "SIGUSR1", "SIGUSR2", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)   # as Python sets it at start-up
    sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False))
    if request["env"].get("PYTHONUNBUFFERED"):
        sys.stdout.reconfigure(write_through=True)
        sys.stderr.reconfigure(write_through=True)
    kind, target, args = request["argv"][0], request["argv"][1], request["argv"][2:]
    code = 0
    try:
        if kind == "-m":
            sys.argv = [target, *args]   # runpy puts the module's path in argv[0]
            sys.path[0] = request["cwd"]
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c", *args]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit as e:   # as the interpreter ends on it
        if e.code is None:
            code = 0
        elif isinstance(e.code, int):
            code = e.code
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        kind, value, tb = sys.exc_info()
        traceback.print_exception(value.with_traceback(tb.tb_next))
        sys.stdout.flush(), sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # ends by SIGINT, as python does
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        kind, value, tb = sys.exc_info()
        sys.excepthook(kind, value.with_traceback(tb.tb_next), tb.tb_next)   # without this function's frame
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code & 0xFF)


running = {}   # pid -> the request that started it (pids are reused over a long test session)
while True:
    try:
        while running:   # report the children that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if not pid:
                break
            sock.send(json.dumps({"id": running.pop(pid, None),
                                  "returncode": os.waitstatus_to_exitcode(status)}).encode())
    except ChildProcessError:
        running.clear()
    readable, _, _ = __import__("select").select([sock], [], [], 0.02)
    if not readable:
        continue
    message, fds, _, _ = socket.recv_fds(sock, 1 << 22, 3)
    if not message:
        break   # the test process went away
    request = json.loads(message)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        child(request, fds)
    for fd in fds:
        os.close(fd)
    running[pid] = request["id"]
    sock.send(json.dumps({"started": pid, "id": request["id"]}).encode())
"""


class _Server:
    """One warm interpreter of ``backend`` with its environment; children by :meth:`start`."""

    def __init__(self, backend):
        self.backend = backend
        self.env = _base_env(backend)
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", SERVER, str(theirs.fileno()), json.dumps(PRELOAD)],
                                     cwd=REPO_ROOT, env=self.env, pass_fds=[theirs.fileno()],
                                     stdout=subprocess.PIPE, stderr=self.log, stdin=subprocess.DEVNULL)
        theirs.close()
        self.lock = threading.Lock()
        self.returncodes, self.started, self.next_id = {}, {}, 0
        self.ready, self.warned, self.ready_lock = None, False, threading.Lock()

    def wait_ready(self):
        with self.ready_lock:   # one reader of the line, when several threads start children
            return self._wait_ready()

    def _wait_ready(self):
        if self.ready is None:
            line = self.proc.stdout.readline()
            if not line:
                self.log.seek(0)
                self.ready = {"error": f"exit {self.proc.wait()}: " + self.log.read().decode(errors="replace")[-2000:]}
            else:
                self.ready = json.loads(line)
        return self.ready

    def _receive(self, block):
        """Reads the warm interpreter's messages (one if ``block``, else those waiting); the lock held."""
        self.sock.setblocking(block)
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise RuntimeError(f"the warm {self.backend} interpreter ended")
                message = json.loads(data)
                if "started" in message:
                    self.started[message["id"]] = message["started"]
                else:
                    self.returncodes[message["id"]] = message["returncode"]
                if block:
                    return
        except BlockingIOError:
            return
        finally:
            self.sock.setblocking(True)

    def start(self, argv, env, cwd, fds):
        """Starts a child of the warm interpreter on ``fds`` (its stdin, stdout, stderr): (pid, request id)."""
        self.wait_ready()
        with self.lock:
            request_id, self.next_id = self.next_id, self.next_id + 1
            request = {"id": request_id, "argv": argv, "env": env, "cwd": cwd}
            socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            while request_id not in self.started:
                self._receive(block=True)
            return self.started.pop(request_id), request_id

    def returncode(self, request_id):
        """The exit status of the child started for ``request_id`` (None while it runs): by request, not
        pid, because the kernel reuses pids (32768 of them by default) over a long test session."""
        with self.lock:
            if request_id not in self.returncodes:
                self._receive(block=False)
            return self.returncodes.get(request_id)


_SERVERS, _SERVERS_LOCK = {}, threading.Lock()


def _base_env(backend):
    env = dict(os.environ)
    env.update({"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3",
                "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")})
    env.pop("PYTHONUNBUFFERED", None)
    return env


def _server(backend):
    with _SERVERS_LOCK:
        if backend not in _SERVERS:
            _SERVERS[backend] = _Server(backend)
        return _SERVERS[backend]


def warm_up(*backends):
    """Starts the warm interpreters of ``backends`` now, in the background (they take ~10 s)."""
    if not os.environ.get("UNICLR_TESTS_COLD"):
        for backend in backends:
            _server(backend)


@atexit.register
def _stop():
    for server in _SERVERS.values():
        server.sock.close()
        try:
            server.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            server.proc.kill()


def _eligible(argv, env):
    """The warm interpreter able to run ``argv`` with ``env``, or None."""
    if os.environ.get("UNICLR_TESTS_COLD") or env.get("UNICLR_TESTS_COLD") or len(argv) < 3 \
            or argv[1] not in ("-m", "-c"):
        return None
    if os.path.realpath(argv[0]) != os.path.realpath(sys.executable):
        return None
    backend = env.get("KERAS_BACKEND", "tensorflow")
    if backend not in ("tensorflow", "jax"):
        return None
    server = _server(backend)
    if "error" in server.wait_ready():   # it could not start: every child cold, and say why once
        if not server.warned:
            server.warned = True
            warnings.warn(f"tests/warm.py: the warm {backend} interpreter did not start ({server.ready['error']})")
        return None
    if env_differences(server, env):
        return None
    if argv[1] == "-m" and argv[2] in server.ready["modules"]:
        return None
    if argv[1] == "-c" and ("sys.modules" in argv[2] or "NoTensorFlow" in argv[2]):
        return None   # code that looks at what is imported, or hides a module: a fresh interpreter
    return server


def env_differences(server, env):
    """The variables of ``env`` that may not differ from ``server``'s environment and do (sorted): a child
    with any of them starts cold."""
    base, path, differ = server.env, set(server.wait_ready()["path"]) | {""}, []
    for key in set(base) | set(env):
        if base.get(key) == env.get(key) or key in FREE_ENV or key.startswith(("UNICLR_", "PYTEST_")):
            continue
        if key == "PYTHONPATH" and all(p in path or os.path.abspath(p) in path
                                       for p in env.get(key, "").split(os.pathsep)):
            continue
        differ.append(key)
    return sorted(differ)


class WarmProcess:
    """What :class:`subprocess.Popen` offers the tests, for a child of a warm interpreter."""

    def __init__(self, server, argv, env, cwd, text, stdin, stdout, stderr):
        self.args, self.server, self.returncode = argv, server, None
        ends, mine = [], []
        for spec, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
            if spec == subprocess.PIPE:
                r, w = os.pipe()
                ends.append(r if target == 0 else w)
                mine.append((target, w if target == 0 else r))
            elif spec == subprocess.DEVNULL or (spec is None and target == 0):
                ends.append(os.open(os.devnull, os.O_RDWR))
                mine.append((target, None))
            elif spec == subprocess.STDOUT and target == 2:
                ends.append(os.dup(ends[1]))
                mine.append((target, None))
            elif spec is None:
                ends.append(os.dup(target))
                mine.append((target, None))
            else:   # a file object or descriptor
                ends.append(os.dup(spec if isinstance(spec, int) else spec.fileno()))
                mine.append((target, None))
        try:
            self.pid, self._request = server.start(argv[1:], env, cwd, ends)
        finally:
            for fd in ends:
                os.close(fd)
        files = {}
        for target, fd in mine:
            if fd is None:
                files[target] = None
            elif text:
                files[target] = open(fd, "w" if target == 0 else "r", encoding="utf-8", errors="strict")
            else:
                files[target] = open(fd, "wb" if target == 0 else "rb")
        self.stdin, self.stdout, self.stderr = files[0], files[1], files[2]

    def poll(self):
        if self.returncode is None:
            self.returncode = self.server.returncode(self._request)
        return self.returncode

    def wait(self, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.01)
        return self.returncode

    def communicate(self, input=None, timeout=None):
        if self.stdin is not None:
            if input:
                self.stdin.write(input)
            self.stdin.close()
        results = {}

        def read(name, f):
            results[name] = f.read()

        readers = [threading.Thread(target=read, args=(name, f), daemon=True)
                   for name, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
        for t in readers:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in readers:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()) + 5)
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return results.get("stdout"), results.get("stderr")

    def send_signal(self, sig):
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for f in (self.stdin, self.stdout, self.stderr):
            if f is not None:
                f.close()
        self.wait()


def popen(argv, env=None, cwd=None, text=False, stdin=None, stdout=None, stderr=None, **kwargs):
    """:class:`subprocess.Popen` of ``argv``, a child of a warm interpreter when it can be one."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    cwd = os.path.abspath(cwd or os.getcwd())
    universal = text or kwargs.pop("universal_newlines", False)
    server = None if kwargs else _eligible(argv, env)
    if server is None:
        return subprocess.Popen(argv, env=env, cwd=cwd, text=universal, stdin=stdin, stdout=stdout,
                                stderr=stderr, **kwargs)
    return WarmProcess(server, argv, env, cwd, universal, stdin, stdout, stderr)


def run(argv, env=None, cwd=None, text=False, capture_output=False, timeout=None, check=False, input=None,
        stdout=None, stderr=None, **kwargs):
    """:func:`subprocess.run` of ``argv``, through :func:`popen`."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    proc = popen(argv, env=env, cwd=cwd, text=text, stdin=subprocess.PIPE if input is not None else None,
                 stdout=stdout, stderr=stderr, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    result = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check:
        result.check_returncode()
    return result
