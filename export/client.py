r"""Send images to the exported UniCLR model on TF Serving; get features and embeddings back.

    python export/client.py --server=http://localhost:8501 --model=uniclr img1.png img2.jpg [--out=f.npz]
    python export/client.py --grpc=localhost:8500 --model=uniclr img1.png        # needs tensorflow-serving-api

REST (standard library + NumPy): ``POST /v1/models/NAME:predict``
with ``{"signature_name": "serving_default", "instances": [<uint8 image [H][W][C]>, ...]}`` (row
format) or ``{"signature_name": ..., "inputs": {"images": [...]}}`` (columnar, ``columnar=True``);
the answer ``{"predictions": [{"features": [...], "embedding": [...]}, ...]}`` or
``{"outputs": {"features": [[...]], "embedding": [[...]]}}`` becomes float32 arrays.

gRPC (``PredictionService.Predict``) is used when ``tensorflow_serving_apis`` is importable
(``pip install --no-deps tensorflow-serving-api`` next to TensorFlow); it is untested here.

Image files are decoded exactly as ``folder:`` datasets are for training, by
:func:`uniclr_tf.data.decode_image` (TensorFlow's decoder when installed, else Pillow's; see
:func:`load_images`). Images are checked before sending with :func:`uniclr_tf.serving.export.check_images`
(uint8, rank 4, the model's channel count, read from the model's metadata when not given). Images
of different sizes go in separate requests (one request holds one tensor); the model resamples each
to its training size.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np

try:
    from uniclr_tf.serving.export import check_images
except ImportError:  # run as a script from a checkout: export/client.py
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from uniclr_tf.serving.export import check_images

SIGNATURE = "serving_default"
INPUT_NAME = "images"


class ServingError(RuntimeError):
    """The server answered with an error (``{"error": ...}`` and an HTTP status)."""

    def __init__(self, message, status=None):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


def _model_url(server, model, version=None):
    url = f"{server.rstrip('/')}/v1/models/{model}"
    return url + (f"/versions/{int(version)}" if version is not None else "")


def _http(url, payload=None, timeout=60.0):
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method="GET" if data is None else "POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            message = json.loads(body).get("error", body.decode(errors="replace"))
        except ValueError:
            message = body.decode(errors="replace")
        raise ServingError(message, e.code) from None


def rest_metadata(server, model="uniclr", version=None, timeout=60.0):
    """``GET /v1/models/NAME[/versions/V]/metadata``: the model's signature defs."""
    return _http(_model_url(server, model, version) + "/metadata", timeout=timeout)


def channels_from_metadata(metadata, signature=SIGNATURE):
    """The channel count (last dim of the single input) of ``signature`` in a metadata answer."""
    try:
        inputs = metadata["metadata"]["signature_def"]["signature_def"][signature]["inputs"]
        (spec,) = inputs.values()
        size = int(spec["tensor_shape"]["dim"][-1]["size"])
    except (KeyError, ValueError, IndexError, TypeError):
        return None
    return size if size > 0 else None


def build_request(images, signature=SIGNATURE, columnar=False):
    """The JSON body of a REST predict request for a uint8 batch ``[B, H, W, C]``."""
    images = np.asarray(images)
    if columnar:
        return {"signature_name": signature, "inputs": {INPUT_NAME: images.tolist()}}
    return {"signature_name": signature, "instances": images.tolist()}


def parse_response(body):
    """A REST predict answer (row or columnar) → ``{output name: float32 array [B, ...]}``."""
    if "error" in body:
        raise ServingError(body["error"])
    if "predictions" in body:
        rows = body["predictions"]
        if rows and isinstance(rows[0], dict):
            return {k: np.asarray([r[k] for r in rows], dtype=np.float32) for k in rows[0]}
        return {"outputs": np.asarray(rows, dtype=np.float32)}
    if "outputs" in body:
        outputs = body["outputs"]
        if isinstance(outputs, dict):
            return {k: np.asarray(v, dtype=np.float32) for k, v in outputs.items()}
        return {"outputs": np.asarray(outputs, dtype=np.float32)}
    raise ServingError(f"unexpected answer without 'predictions' or 'outputs': {str(body)[:200]}")


def rest_predict(images, server="http://localhost:8501", model="uniclr", signature=SIGNATURE,
                 version=None, columnar=False, channels=None, timeout=60.0):
    """Features and embeddings of a uint8 batch ``[B, H, W, C]`` over REST.

    ``channels`` None asks the server's metadata for the model's channel count first.
    Returns ``{"features": [B, F], "embedding": [B, D]}`` float32 arrays.
    """
    if channels is None:
        channels = channels_from_metadata(rest_metadata(server, model, version, timeout), signature)
    images = check_images(images, channels if channels else _own_channels(images))
    body = _http(_model_url(server, model, version) + ":predict", build_request(images, signature, columnar),
                 timeout=timeout)
    return parse_response(body)


def _own_channels(images):
    array = np.asarray(images)
    return array.shape[-1] if array.ndim == 4 else 0


def grpc_predict(images, target="localhost:8500", model="uniclr", signature=SIGNATURE, version=None,
                 channels=None, timeout=60.0):
    """The same over gRPC (``PredictionService.Predict``); needs ``tensorflow_serving_apis``. Untested."""
    import grpc
    from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    images = check_images(images, channels or _own_channels(images))
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = int(version)
    shape = tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in images.shape])
    request.inputs[INPUT_NAME].CopyFrom(tensor_pb2.TensorProto(
        dtype=types_pb2.DT_UINT8, tensor_shape=shape, tensor_content=np.ascontiguousarray(images).tobytes()))
    with grpc.insecure_channel(target) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(request, timeout=timeout)
    outputs = {}
    for name, tensor in response.outputs.items():
        if tensor.dtype != types_pb2.DT_FLOAT:
            raise ServingError(f"output {name!r}: expected DT_FLOAT; received dtype enum {tensor.dtype}")
        dims = [d.size for d in tensor.tensor_shape.dim]
        values = (np.frombuffer(tensor.tensor_content, dtype=np.float32) if tensor.tensor_content
                  else np.asarray(tensor.float_val, dtype=np.float32))
        outputs[name] = values.reshape(dims)
    return outputs


def grpc_available():
    try:
        import grpc  # noqa: F401
        import tensorflow_serving.apis.prediction_service_pb2_grpc  # noqa: F401
    except ImportError:
        return False
    return True


def load_images(paths, channels, backend=None):
    """Image files → list of uint8 ``[H, W, channels]`` arrays, decoded as training decodes them.

    Each file goes through :func:`uniclr_tf.data.decode_image`, the decoder of ``folder:`` datasets
    (16-bit PNGs keep their high byte: 10000 → 39, not 255; alpha dropped; palettes → RGB).
    ``backend``: None uses TensorFlow's decoder when TensorFlow is installed (training's, exactly),
    else Pillow's (the same pixels except JPEG, a few levels off; see ``decode_image``).
    A grey image sent to an RGB model is repeated over 3 channels, as training stacks a dataset that
    mixes grey and colour images. A colour image sent to a grey model (training never has that
    case: one colour image makes a folder dataset RGB) is converted to luma (Pillow's ``"L"``).
    """
    from uniclr_tf.data import ImageDecodeError, decode_image
    from uniclr_tf.data.decode import read_image_file
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3; received {channels}")
    arrays = []
    for path in paths:
        try:  # a regular file only, of a size an image within the pixel budget can have; then its header
            array = decode_image(read_image_file(path), backend=backend)
        except ImageDecodeError as e:
            raise ValueError(f"{path}: {e}") from None
        if array.shape[-1] != channels:
            if channels == 3:
                array = np.repeat(array, 3, axis=-1)
            else:
                from PIL import Image
                array = np.asarray(Image.fromarray(array).convert("L"), dtype=np.uint8)[..., None]
        arrays.append(array)
    return arrays


def predict_images(arrays, predict, batch_size=32):
    """Calls ``predict(batch)`` on runs of same-size images; returns outputs in the input order."""
    results, groups = {}, {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.shape, []).append(i)
    for indices in groups.values():
        for start in range(0, len(indices), batch_size):
            chunk = indices[start:start + batch_size]
            out = predict(np.stack([arrays[i] for i in chunk]))
            for j, i in enumerate(chunk):
                results[i] = {k: v[j] for k, v in out.items()}
    names = list(results[0]) if results else []
    return {k: np.stack([results[i][k] for i in range(len(arrays))]) for k in names}


def main(argv=None):
    parser = argparse.ArgumentParser(description="Features/embeddings of image files from TF Serving.")
    parser.add_argument("images", nargs="+", help="image files (PNG, JPEG, ...)")
    parser.add_argument("--server", default="http://localhost:8501", help="REST base URL")
    parser.add_argument("--grpc", default="", help="host:port of the gRPC API (uses gRPC instead of REST)")
    parser.add_argument("--model", default="uniclr", help="model name (MODEL_NAME of tensorflow/serving)")
    parser.add_argument("--version", type=int, default=None, help="model version (default: the latest)")
    parser.add_argument("--signature", default=SIGNATURE)
    parser.add_argument("--channels", type=int, default=None,
                        help="1 or 3; default: the model's metadata (REST) or 3 (gRPC)")
    parser.add_argument("--columnar", action="store_true", help="send the columnar 'inputs' form")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--out", default="", help=".npz file for the arrays (default: print JSON lines)")
    args = parser.parse_args(argv)

    try:
        if args.grpc:
            if not grpc_available():
                sys.exit("error: --grpc needs `grpcio` and `tensorflow-serving-api` "
                         "(pip install --no-deps tensorflow-serving-api)")
            channels = args.channels or 3
            def predict(batch):  # noqa: E306
                return grpc_predict(batch, args.grpc, args.model, args.signature, args.version, channels)
        else:
            channels = args.channels or channels_from_metadata(
                rest_metadata(args.server, args.model, args.version), args.signature) or 3
            def predict(batch):  # noqa: E306
                return rest_predict(batch, args.server, args.model, args.signature, args.version,
                                    args.columnar, channels)
        outputs = predict_images(load_images(args.images, channels), predict, args.batch_size)
    except (ServingError, ValueError, OSError) as e:
        sys.exit(f"error: {e}")

    if args.out:
        np.savez(args.out, paths=np.asarray(args.images), **outputs)
        print(f"wrote {', '.join(f'{k} {tuple(v.shape)}' for k, v in outputs.items())} to {args.out}")
    else:
        for i, path in enumerate(args.images):
            print(json.dumps({"image": path, **{k: v[i].tolist() for k, v in outputs.items()}}))


if __name__ == "__main__":
    main()
