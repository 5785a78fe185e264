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
a listen backlog of :data:`BACKLOG` connections, a body limit (``--max_body_mb``; 413 above it, 411
without a ``Content-Length``), a read timeout of :data:`READ_TIMEOUT_S` per socket operation (a
half-sent request does not hold a thread), and an HTTP error for every bad request (400 for bad
JSON, too deep JSON, a bad ``Content-Length``, values of the wrong type: JSON ``true`` is not a
number; 500 for a failure of the model).

It is NOT TF Serving, which stays the production path (export/README.md): one model, one version loaded at start (no polling for new versions), no
batching, no gRPC, no classify/regress, no ``{"b64": ...}`` values. Needs TensorFlow (not Keras).
"""

import argparse
import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

#: Pending connections the listening socket queues (socketserver's default, 5, reset connections
#: under a few hundred concurrent clients).
BACKLOG = 1024
#: Seconds a socket read or write may wait (a client that stops sending mid-request is dropped).
READ_TIMEOUT_S = 10.0
#: Default largest request body, in MB: JSON numbers take ~50x their size once parsed.
MAX_BODY_MB = 16

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


class Servable:
    """One loaded SavedModel version and the request/response conversions around it."""

    def __init__(self, model_base_path, model_name="uniclr"):
        import tensorflow as tf
        self.tf = tf
        self.name = model_name
        self.version, self.path = latest_version(model_base_path)
        self.model = tf.saved_model.load(self.path)
        self.signatures = dict(self.model.signatures)
        self._metadata = None

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
        feeds = self._row_feeds(body["instances"], specs) if row else self._columnar_feeds(body["inputs"], specs)
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


def _handler(servable, max_body_bytes=MAX_BODY_MB << 20):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = READ_TIMEOUT_S  # socketserver sets it on the connection's socket

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
                if e.status in (411, 413):  # the body was not read: this connection cannot go on
                    self.close_connection = True
                self._reply(e.status, {"error": str(e)})
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


class _HTTPServer(ThreadingHTTPServer):
    """A thread per connection, a listen backlog of :data:`BACKLOG`."""

    request_queue_size = BACKLOG
    daemon_threads = True


class StandinServer:
    """``with StandinServer(base_path) as server: ... server.url``: serves from a daemon thread.
    ``servable``: an object with ``status`` / ``metadata`` / ``predict`` instead of loading one."""

    def __init__(self, model_base_path, model_name="uniclr", host="127.0.0.1", port=0,
                 max_body_mb=MAX_BODY_MB, servable=None):
        self.servable = servable or Servable(model_base_path, model_name)
        self.httpd = _HTTPServer((host, port), _handler(self.servable, int(max_body_mb * 2 ** 20)))
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
    args = parser.parse_args(argv)
    try:
        server = StandinServer(args.model_base_path, args.model_name, args.host, args.port, args.max_body_mb)
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
