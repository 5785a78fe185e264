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

It is NOT TF Serving: one model, one version loaded at start (no polling for new versions), no
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
    if np.issubdtype(dtype, np.integer):
        if array.dtype.kind not in "biu":
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


def _handler(servable):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

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
                    length = int(self.headers.get("Content-Length") or 0)
                    try:
                        body = json.loads(self.rfile.read(length) or b"null")
                    except ValueError as e:
                        raise RequestError(f"JSON Parse error: {e}")
                    return self._reply(200, servable.predict(name, version, body))
                raise RequestError(f"Malformed request: {method} {self.path}", 404)
            except RequestError as e:
                self._reply(e.status, {"error": str(e)})

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self._route("GET")

        def do_POST(self):  # noqa: N802
            self._route("POST")

    return Handler


class StandinServer:
    """``with StandinServer(base_path) as server: ... server.url``: serves from a daemon thread."""

    def __init__(self, model_base_path, model_name="uniclr", host="127.0.0.1", port=0):
        self.servable = Servable(model_base_path, model_name)
        self.httpd = ThreadingHTTPServer((host, port), _handler(self.servable))
        self.httpd.daemon_threads = True
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
    args = parser.parse_args(argv)
    try:
        server = StandinServer(args.model_base_path, args.model_name, args.host, args.port)
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
