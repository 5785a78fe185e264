r"""A small local stand-in for TF Serving's REST API, for tests and demos without the server binary.

    python export/standin_server.py --model_base_path=runs/demo/export --model_name=uniclr [--port=8501]

It loads the newest numbered version folder under ``--model_base_path`` (TF Serving's default
"latest" policy; ``export_run(..., version=1)`` / ``--version=1`` writes that layout) with
``tf.saved_model.load`` and answers the same requests as ``tensorflow_model_server --rest_api_port``:

    GET  /v1/models/NAME[/versions/V]            model status
    GET  /v1/models/NAME[/versions/V]/metadata   signature defs (TF Serving's JSON layout)
    POST /v1/models/NAME[/versions/V]:predict    {"signature_name": ..., "instances": [...]}  (row)
                                                 {"signature_name": ..., "inputs": ...}       (columnar)

Row requests get ``{"predictions": [{"features": [...], "embedding": [...]}, ...]}`` (one dict per
instance; a bare value per instance for single-output signatures), columnar ones
``{"outputs": {"features": [[...]], ...}}``. Errors are ``{"error": "..."}`` with HTTP 400 (404 for
an unknown model or version), as TF Serving does; JSON numbers must fit the input dtype (1.5 or 300
for a uint8 input are rejected, as TF Serving rejects them).

Hardened against load and bad requests as a stand-in must be (it still is no production server):

* connections are read by one thread that waits on all of them at once (``selectors``): a request
  reaches a worker only once its headers and whole body have arrived, so a slow or silent client
  holds no worker; a request (or an idle kept-alive connection) must arrive within
  :data:`READ_TIMEOUT_S` seconds in all, else the connection is closed;
* a fixed pool of ``--workers`` threads answers complete requests; at most :data:`MAX_CONNECTIONS`
  connections are open at once (more are closed at once), the request bodies held while they wait
  total at most :data:`BUFFER_MB` (503 above it), and the bodies being parsed at once total at most
  one ``--max_body_mb`` (JSON numbers take ~50x their size once parsed);
* the work of a request is bounded before the model runs: at most ``--max_batch_size`` instances,
  and at most ``--max_request_pixels`` pixels (instances x height x width, each image counted at
  least at the training size it is resampled to); over either, 413 with a one-line JSON error;
* a body limit (``--max_body_mb``; 413 above it, 411 without a ``Content-Length``), a listen
  backlog of :data:`BACKLOG` connections, and an HTTP error for every bad request (400 for bad
  JSON, too deep JSON, a bad ``Content-Length``, values of the wrong type: JSON ``true`` is not a
  number; 500 for a failure of the model).

It is NOT TF Serving, which stays the production path (export/README.md): one model, one version loaded at start (no polling for new versions), no
batching, no gRPC, no classify/regress, no ``{"b64": ...}`` values. Needs TensorFlow (not Keras).
"""

import argparse
import concurrent.futures
import io
import json
import os
import re
import selectors
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import numpy as np

#: Pending connections the listening socket queues (socketserver's default, 5, reset connections
#: under a few hundred concurrent clients).
BACKLOG = 1024
#: Seconds a whole request may take to arrive (and an idle kept-alive connection may wait), and a
#: reply to be sent: a client that stops sending, or sends 1 byte a second, is dropped then.
READ_TIMEOUT_S = 10.0
#: Default largest request body, in MB: JSON numbers take ~50x their size once parsed.
MAX_BODY_MB = 16
#: Default worker threads (requests answered at once).
WORKERS = 8
#: Default most instances in one request.
MAX_BATCH_SIZE = 1024
#: Default most pixels in one request: instances x height x width, each image counted at least at
#: the training size (every image is resampled to it): e.g. 167 images of 224x224, 10,700 of 28x28.
MAX_REQUEST_PIXELS = 1 << 23
#: Open connections at most; more are closed as they come.
MAX_CONNECTIONS = 4096
#: Request bytes held (received, waiting for a worker) at most, in MB; a request past it gets 503.
BUFFER_MB = 256
_MAX_HEADER_BYTES = 65536

_PATH = re.compile(r"^/v1/models/(?P<name>[^/:]+)(?:/versions/(?P<version>\d+))?(?P<rest>/metadata|:predict)?$")


class RequestError(Exception):
    """A bad request: answered with ``{"error": message}`` and ``status``."""

    def __init__(self, message, status=400):
        super().__init__(message)
        self.status = status


def latest_version(model_base_path):
    """``(version, path)`` of the highest numbered SavedModel folder under ``model_base_path``."""
    versions = []
    if os.path.isdir(model_base_path):
        versions = [int(d) for d in os.listdir(model_base_path)
                    if d.isdigit() and os.path.isfile(os.path.join(model_base_path, d, "saved_model.pb"))]
    if not versions:
        raise FileNotFoundError(
            f"no numbered version folder with a saved_model.pb under {model_base_path!r}; TF Serving "
            f"needs <base>/<version>/saved_model.pb (export with --version=1)")
    version = max(versions)
    return version, os.path.join(model_base_path, str(version))


def _to_array(value, spec, where):
    """JSON value → NumPy array of the signature input's dtype, refusing values that do not fit."""
    dtype = np.dtype(spec.dtype.as_numpy_dtype)
    try:
        array = np.asarray(value)
    except ValueError as e:  # ragged nested lists
        raise RequestError(f"{where}: {e}")
    if array.dtype == object:
        raise RequestError(f"{where}: the values do not form a rectangular array (all instances must "
                           f"have the same shape)")
    if array.size == 0:
        raise RequestError(f"{where}: empty input")
    if dtype.kind != "b" and _holds_bool(value):  # JSON true / false are not numbers (NumPy would take 1 / 0)
        raise RequestError(f"{where}: JSON value true/false is not of expected type: {dtype.name}")
    if np.issubdtype(dtype, np.integer):
        if array.dtype.kind not in "iu":
            flat = array.reshape(-1)
            if array.dtype.kind == "f" and np.any(flat != np.round(flat)):
                flat = flat[flat != np.round(flat)]
            raise RequestError(f"{where}: JSON value {flat[0].item()!r} is not of expected "
                               f"type: {dtype.name} (integers only)")
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise RequestError(f"{where}: value out of range for {dtype.name} [{info.min}, {info.max}]: "
                               f"received min {array.min()}, max {array.max()}")
    elif np.issubdtype(dtype, np.floating) and array.dtype.kind not in "biuf":
        raise RequestError(f"{where}: expected numbers of type {dtype.name}; received {array.dtype}")
    return array.astype(dtype)


def _holds_bool(value):
    """Whether a parsed JSON value holds ``true`` or ``false`` anywhere (iterative: any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bool):
            return True
        if isinstance(item, list):
            stack.extend(item)
    return False


def check_work(feeds, max_batch_size=MAX_BATCH_SIZE, max_pixels=MAX_REQUEST_PIXELS, train_pixels=0, count=None):
    """Raises a 413 :class:`RequestError` (one line naming the limit and its flag) when a request's
    work is over the budget: more than ``max_batch_size`` instances, or more than ``max_pixels``
    pixels (instances x height x width of each image input, an image counted at least at
    ``train_pixels``, the size it is resampled to). ``count``: the instances, known before ``feeds``
    (the parsed body's list) are made into arrays."""
    if count is not None and count > max_batch_size:
        raise RequestError(f"request of {count:,} instances is over the limit of {max_batch_size:,} "
                           "(--max_batch_size); send smaller batches", 413)
    for name, array in (feeds or {}).items():
        shape = tuple(array.shape)
        if not shape:
            continue
        if shape[0] > max_batch_size:
            raise RequestError(f"request of {shape[0]:,} instances is over the limit of {max_batch_size:,} "
                               "(--max_batch_size); send smaller batches", 413)
        pixels = 1
        for d in shape[1:3]:
            pixels *= int(d)
        total = shape[0] * max(pixels, int(train_pixels or 0))
        if total > max_pixels:
            size = "x".join(str(d) for d in shape[1:3])
            raise RequestError(f"request of {shape[0]:,} instances of {size} (each resampled to at least "
                               f"{int(train_pixels or pixels):,} pixels) = {total:,} pixels is over the limit of "
                               f"{max_pixels:,} (--max_request_pixels); send smaller batches", 413)


def _train_pixels(model_base_path, version_path):
    """Height x width the exported model resamples images to (its ``export.json``), else 0."""
    for folder in (version_path, model_base_path):
        try:
            with open(os.path.join(folder, "export.json")) as f:
                height, width = json.load(f)["image_size"]
            return int(height) * int(width)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return 0


class Servable:
    """One loaded SavedModel version and the request/response conversions around it; every request's
    work is checked against the budget (:func:`check_work`) before the model runs."""

    def __init__(self, model_base_path, model_name="uniclr", max_batch_size=MAX_BATCH_SIZE,
                 max_request_pixels=MAX_REQUEST_PIXELS):
        import tensorflow as tf
        self.tf = tf
        self.name = model_name
        self.version, self.path = latest_version(model_base_path)
        self.model = tf.saved_model.load(self.path)
        self.signatures = dict(self.model.signatures)
        self._metadata = None
        self.limits = dict(max_batch_size=int(max_batch_size), max_pixels=int(max_request_pixels),
                           train_pixels=_train_pixels(model_base_path, self.path))

    def _check_target(self, name, version):
        if name != self.name:
            raise RequestError(f"Servable not found for request: Latest({name})", 404)
        if version is not None and int(version) != self.version:
            raise RequestError(f"Servable not found for request: Specific({name}, {version})", 404)

    def status(self, name, version):
        self._check_target(name, version)
        return {"model_version_status": [{"version": str(self.version), "state": "AVAILABLE",
                                          "status": {"error_code": "OK", "error_message": ""}}]}

    def metadata(self, name, version):
        self._check_target(name, version)
        if self._metadata is None:
            from google.protobuf import json_format
            from tensorflow.core.protobuf import saved_model_pb2
            proto = saved_model_pb2.SavedModel()
            with open(os.path.join(self.path, "saved_model.pb"), "rb") as f:
                proto.ParseFromString(f.read())
            defs = {k: json_format.MessageToDict(v, preserving_proto_field_name=True)
                    for k, v in proto.meta_graphs[0].signature_def.items() if not k.startswith("__")}
            self._metadata = {"signature_def": {"signature_def": defs}}
        return {"model_spec": {"name": self.name, "signature_name": "", "version": str(self.version)},
                "metadata": self._metadata}

    def predict(self, name, version, body):
        self._check_target(name, version)
        if not isinstance(body, dict):
            raise RequestError("JSON request body must be an object")
        signature = body.get("signature_name", "serving_default")
        if signature not in self.signatures:
            raise RequestError(f'Serving signature name: "{signature}" not found in signature def')
        fn = self.signatures[signature]
        specs = fn.structured_input_signature[1]
        if ("instances" in body) == ("inputs" in body):
            raise RequestError("Missing 'inputs' or 'instances' key" if "instances" not in body else
                               "Not formatted correctly expecting only one of 'inputs' or 'instances' keys exists")
        row = "instances" in body
        if row and isinstance(body["instances"], list):
            check_work(None, count=len(body["instances"]), **self.limits)
        feeds = self._row_feeds(body["instances"], specs) if row else self._columnar_feeds(body["inputs"], specs)
        check_work(feeds, **self.limits)
        try:
            outputs = fn(**{k: self.tf.constant(v) for k, v in feeds.items()})
        except (self.tf.errors.InvalidArgumentError, ValueError, TypeError) as e:
            # Keep the op's own message, without TF's graph-execution preamble and node names.
            message = getattr(e, "message", str(e))
            noise = ("[[", "<", "Detected at", "Graph execution")
            lines = [line.strip() for line in message.splitlines()
                     if line.strip() and not line.strip().startswith(noise)]
            raise RequestError(lines[0] if lines else message)
        outputs = {k: np.asarray(v) for k, v in outputs.items()}
        if row:
            if len(outputs) == 1:
                return {"predictions": next(iter(outputs.values())).tolist()}
            batch = len(next(iter(outputs.values())))
            return {"predictions": [{k: v[i].tolist() for k, v in outputs.items()} for i in range(batch)]}
        if len(outputs) == 1:
            return {"outputs": next(iter(outputs.values())).tolist()}
        return {"outputs": {k: v.tolist() for k, v in outputs.items()}}

    @staticmethod
    def _row_feeds(instances, specs):
        if not isinstance(instances, list) or not instances:
            raise RequestError("'instances' must be a non-empty list (one entry per example)")
        names = list(specs)
        if all(isinstance(x, dict) for x in instances):
            for i, x in enumerate(instances):
                if set(x) != set(names):
                    raise RequestError(f"Failed to process element: {i} of 'instances' list. Error: expected "
                                       f"named inputs {sorted(names)}; received {sorted(x)}")
            columns = {k: [x[k] for x in instances] for k in names}
        elif len(names) == 1:
            columns = {names[0]: instances}
        else:
            raise RequestError(f"the signature has inputs {sorted(names)}: each instance must be an object "
                               f"with these keys")
        return {k: _to_array(v, specs[k], f"'instances' input {k!r}") for k, v in columns.items()}

    @staticmethod
    def _columnar_feeds(inputs, specs):
        names = list(specs)
        if isinstance(inputs, dict):
            if set(inputs) != set(names):
                raise RequestError(f"'inputs': expected named inputs {sorted(names)}; received {sorted(inputs)}")
            columns = inputs
        elif len(names) == 1:
            columns = {names[0]: inputs}
        else:
            raise RequestError(f"the signature has inputs {sorted(names)}: 'inputs' must be an object with these keys")
        return {k: _to_array(v, specs[k], f"'inputs' input {k!r}") for k, v in columns.items()}


class _ByteBudget:
    """At most ``capacity`` bytes held at once by the callers of :meth:`hold` (each asks for at most
    ``capacity``): the bodies parsed at once."""

    def __init__(self, capacity):
        self.capacity, self.used = max(1, int(capacity)), 0
        self._cond = threading.Condition()

    def hold(self, n):
        n = min(max(1, int(n)), self.capacity)
        budget = self

        class Held:
            def __enter__(self):
                with budget._cond:
                    budget._cond.wait_for(lambda: budget.used + n <= budget.capacity)
                    budget.used += n

            def __exit__(self, *exc):
                with budget._cond:
                    budget.used -= n
                    budget._cond.notify_all()
        return Held()


def _handler(servable, max_body_bytes=MAX_BODY_MB << 20):
    parsing = _ByteBudget(max_body_bytes)

    class Handler(BaseHTTPRequestHandler):
        """One request, already received whole (:class:`_Server`): ``request`` is ``(socket, bytes)``."""

        protocol_version = "HTTP/1.1"

        def setup(self):
            sock, data = self.request
            self.connection = sock
            self.rfile = io.BytesIO(data)
            self.wfile = _Writer(sock)

        def handle(self):
            self.close_connection = True
            self.handle_one_request()

        def finish(self):
            pass

        def log_message(self, fmt, *args):  # quiet; TF Serving does not log each request either
            pass

        def _reply(self, status, payload):
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, method):
            match = _PATH.match(self.path.split("?", 1)[0])
            try:
                if not match:
                    raise RequestError(f"Malformed request: {method} {self.path}", 404)
                name, version, rest = match.group("name"), match.group("version"), match.group("rest")
                if method == "GET" and rest is None:
                    return self._reply(200, servable.status(name, version))
                if method == "GET" and rest == "/metadata":
                    return self._reply(200, servable.metadata(name, version))
                if method == "POST" and rest == ":predict":
                    return self._reply(200, servable.predict(name, version, self._json_body()))
                raise RequestError(f"Malformed request: {method} {self.path}", 404)
            except RequestError as e:
                if e.status in (411, 413):  # the body may not have been read: this connection cannot go on
                    self.close_connection = True
                self._reply(e.status, {"error": str(e).splitlines()[0] if str(e) else ""})
            except (TimeoutError, ConnectionError):
                raise  # http.server drops the connection
            except Exception as e:  # the model failed: still an HTTP answer, in one line
                self._reply(500, {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e) else ''}"})

        def _json_body(self):
            """The request's JSON body, checked: a Content-Length, at most ``max_body_bytes``, JSON."""
            text = self.headers.get("Content-Length")
            if text is None:
                raise RequestError("a POST body needs a Content-Length header", 411)
            if not text.strip().isdigit():
                raise RequestError(f"bad Content-Length header: {text!r}")
            length = int(text)
            if length > max_body_bytes:
                raise RequestError(f"request body of {length} bytes is over the limit of {max_body_bytes} bytes "
                                   "(--max_body_mb)", 413)
            data = self.rfile.read(length)
            if len(data) < length:
                raise RequestError(f"request body ended after {len(data)} of {length} bytes")
            with parsing.hold(len(data)):  # the bodies parsed at once: one --max_body_mb in all
                try:
                    return json.loads(data or b"null")
                except RecursionError:
                    raise RequestError("JSON Parse error: nested too deeply") from None
                except ValueError as e:
                    raise RequestError(f"JSON Parse error: {e}") from None

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self._route("GET")

        def do_POST(self):  # noqa: N802
            self._route("POST")

    return Handler


class _Writer:
    """The connection's output: each write sent whole within :data:`READ_TIMEOUT_S` (a client that
    does not read its reply is dropped then)."""

    def __init__(self, sock):
        self.sock = sock

    def write(self, data):
        self.sock.settimeout(READ_TIMEOUT_S)
        self.sock.sendall(data)
        return len(data)

    def flush(self):
        pass


class _Connection:
    __slots__ = ("sock", "buffer", "deadline", "need", "held")

    def __init__(self, sock, buffer=b""):
        self.sock, self.buffer = sock, bytearray(buffer)
        self.deadline = time.monotonic() + READ_TIMEOUT_S
        self.need = None  # bytes of the whole request, once its headers are in
        self.held = 0  # bytes counted in the buffer budget


def _request_size(head, max_body_bytes):
    """Bytes of the request whose headers are ``head`` (ending with the blank line): the headers
    plus ``Content-Length`` bytes of body; the headers alone when there is no body to wait for (none
    declared, a bad or too large one: the handler answers those)."""
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = value.strip()
    if length is None or not length.isdigit() or int(length) > max_body_bytes:
        return len(head)
    return len(head) + int(length)


class _Server:
    """The stand-in's HTTP server: one thread reads every connection (:mod:`selectors`) until a
    request is whole, a pool of worker threads answers whole requests (see the module docstring)."""

    def __init__(self, address, handler, workers=WORKERS, max_body_bytes=MAX_BODY_MB << 20):
        self.handler, self.max_body_bytes = handler, max_body_bytes
        self.socket = socket.socket(socket.AF_INET6 if ":" in address[0] else socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(address)
        self.socket.listen(BACKLOG)
        self.socket.setblocking(False)
        self.server_address = self.socket.getsockname()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, int(workers)),
                                                          thread_name_prefix="standin-worker")
        self.selector = selectors.DefaultSelector()
        self.connections = {}
        self.buffered = 0
        self._returned = []  # connections handed back by workers (kept alive)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stop = threading.Event()
        self._stopped = threading.Event()

    # --- the reader thread ---

    def serve_forever(self):
        self.selector.register(self.socket, selectors.EVENT_READ, "accept")
        self.selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                for key, _ in self.selector.select(timeout=0.1):
                    if key.data == "accept":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            while self._wake_r.recv(4096):
                                pass
                        except (BlockingIOError, InterruptedError):
                            pass
                    else:
                        self._read(key.data)
                self._take_returned()
                self._expire()
        finally:
            self._stopped.set()

    def _accept(self):
        for _ in range(64):
            try:
                sock, _ = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if len(self.connections) >= MAX_CONNECTIONS:
                sock.close()
                continue
            sock.setblocking(False)
            self._watch(_Connection(sock))

    def _watch(self, conn):
        self.connections[conn.sock] = conn
        self.selector.register(conn.sock, selectors.EVENT_READ, conn)
        if conn.buffer:
            self._read(conn, fresh=False)

    def _drop(self, conn, close=True):
        self.connections.pop(conn.sock, None)
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError, OSError):
            pass
        self._hold(-conn.held)
        conn.held = 0
        if close:
            try:
                conn.sock.close()
            except OSError:
                pass

    def _read(self, conn, fresh=True):
        if fresh:
            try:
                data = conn.sock.recv(1 << 20)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return self._drop(conn)
            if not data:
                return self._drop(conn)
            conn.buffer += data
            self._hold(len(data))
            conn.held += len(data)
        if conn.need is None:
            end = conn.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(conn.buffer) > _MAX_HEADER_BYTES:
                    return self._reply_now(conn, 431, "request headers too large")
                return
            conn.need = _request_size(bytes(conn.buffer[:end + 4]), self.max_body_bytes)
        if self.buffered > BUFFER_MB << 20:
            return self._reply_now(conn, 503, "the server holds too many request bytes; retry later")
        if len(conn.buffer) < conn.need:
            return
        self._drop(conn, close=False)
        data, rest = bytes(conn.buffer[:conn.need]), bytes(conn.buffer[conn.need:])
        self._hold(len(data))  # held until a worker is done with it
        self.pool.submit(self._answer, conn.sock, data, rest)

    def _hold(self, n):
        with self._lock:
            self.buffered += n

    def _reply_now(self, conn, status, message):
        self._drop(conn, close=False)
        self.pool.submit(self._error, conn.sock, status, message)

    def _expire(self):
        now = time.monotonic()
        for conn in [c for c in self.connections.values() if c.deadline <= now]:
            self._drop(conn)  # a slow or silent client: closed, no worker was ever held

    def _take_returned(self):
        with self._lock:
            returned, self._returned = self._returned, []
        for sock, rest in returned:
            if self._stop.is_set() or len(self.connections) >= MAX_CONNECTIONS:
                sock.close()
                continue
            sock.setblocking(False)
            self._watch(_Connection(sock, rest))

    # --- the workers ---

    def _answer(self, sock, data, rest):
        keep = False
        try:
            handler = self.handler((sock, data), sock.getpeername() if sock.fileno() >= 0 else None, self)
            keep = not handler.close_connection
        except (OSError, ValueError):
            keep = False
        except Exception:  # noqa: BLE001 - a worker never dies of one request
            keep = False
        finally:
            self._hold(-len(data))
        if keep and not self._stop.is_set():
            with self._lock:
                self._returned.append((sock, rest))
            self._wake()
        else:
            try:
                sock.close()
            except OSError:
                pass

    def _error(self, sock, status, message):
        body = json.dumps({"error": message}).encode()
        try:
            sock.settimeout(READ_TIMEOUT_S)
            sock.sendall(f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            sock.close()

    def _wake(self):
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass

    # --- socketserver's interface ---

    def shutdown(self):
        self._stop.set()
        self._wake()
        self._stopped.wait(timeout=10)

    def server_close(self):
        self._stop.set()
        for conn in list(self.connections.values()):
            self._drop(conn)
        self.pool.shutdown(wait=False, cancel_futures=True)
        for s in (self.socket, self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
        try:
            self.selector.close()
        except (OSError, RuntimeError):
            pass


class StandinServer:
    """``with StandinServer(base_path) as server: ... server.url``: serves from a daemon thread.
    ``servable``: an object with ``status`` / ``metadata`` / ``predict`` instead of loading one."""

    def __init__(self, model_base_path, model_name="uniclr", host="127.0.0.1", port=0,
                 max_body_mb=MAX_BODY_MB, servable=None, workers=WORKERS, max_batch_size=MAX_BATCH_SIZE,
                 max_request_pixels=MAX_REQUEST_PIXELS):
        self.servable = servable or Servable(model_base_path, model_name, max_batch_size, max_request_pixels)
        max_body = int(max_body_mb * 2 ** 20)
        self.httpd = _Server((host, port), _handler(self.servable, max_body), workers, max_body)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        self._thread = None

    def start(self):
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_base_path", required=True, help="folder holding numbered SavedModel versions")
    parser.add_argument("--model_name", default="uniclr")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8501, help="0 picks a free port")
    parser.add_argument("--max_body_mb", type=float, default=MAX_BODY_MB, help="largest request body (413 above)")
    parser.add_argument("--max_batch_size", type=int, default=MAX_BATCH_SIZE,
                        help="most instances in one request (413 above)")
    parser.add_argument("--max_request_pixels", type=int, default=MAX_REQUEST_PIXELS,
                        help="most pixels in one request: instances x height x width, each image counted at least "
                             "at the training size (413 above)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="worker threads (requests answered at once)")
    args = parser.parse_args(argv)
    try:
        server = StandinServer(args.model_base_path, args.model_name, args.host, args.port, args.max_body_mb,
                               workers=args.workers, max_batch_size=args.max_batch_size,
                               max_request_pixels=args.max_request_pixels)
    except (FileNotFoundError, OSError) as e:
        sys.exit(f"error: {e}")
    print(f"stand-in REST server for model {args.model_name!r} version {server.servable.version}: "
          f"{server.url}/v1/models/{args.model_name}:predict (Ctrl-C stops)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
