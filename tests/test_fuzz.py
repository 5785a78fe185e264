"""Property tests of the input boundary (Hypothesis, on a small, fixed budget): whatever the bytes of
an image, a record, a backup's state file or a request, the answer is a result within its budget or
one clear refusal, never another exception, a hang or an allocation the budget did not allow."""

import io
import json
import struct
import zlib

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: Small and deterministic: the suite runs these every time, in a few seconds.
BUDGET = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
MAX_PIXELS = 4096


def _image(fmt, height, width):
    from PIL import Image
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((height, width, 3), np.uint8)).save(buffer, fmt)
    return buffer.getvalue()


SEEDS = {fmt: _image(fmt, 6, 5) for fmt in ("PNG", "JPEG", "GIF", "BMP", "WEBP")}
#: Where each format's header keeps its size (offset, length, byte order).
SIZE_FIELDS = {"PNG": [(16, 4, "big"), (20, 4, "big")], "GIF": [(6, 2, "little"), (8, 2, "little")],
               "BMP": [(18, 4, "little"), (22, 4, "little")], "WEBP": [(24, 3, "little"), (27, 3, "little")],
               "JPEG": []}


@st.composite
def hostile_images(draw):
    """A valid small image with its size fields, or any bytes of it, replaced; or bytes alone."""
    kind = draw(st.sampled_from(["resized", "mutated", "random", "truncated"]))
    if kind == "random":
        return draw(st.binary(max_size=256))
    fmt = draw(st.sampled_from(sorted(SEEDS)))
    raw = bytearray(SEEDS[fmt])
    if kind == "resized":
        for offset, length, order in SIZE_FIELDS[fmt]:
            value = draw(st.integers(0, 2 ** (8 * length) - 1))
            if fmt == "PNG":  # keep the header's checksum right, so the decoder trusts it
                raw[offset:offset + length] = value.to_bytes(length, order)
                raw[29:33] = zlib.crc32(bytes(raw[12:29])).to_bytes(4, "big")
            else:
                raw[offset:offset + length] = value.to_bytes(length, order)
    elif kind == "mutated":
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, len(raw) - 1))
            raw[at] = draw(st.integers(0, 255))
    else:
        raw = raw[:draw(st.integers(0, len(raw)))]
    return bytes(raw)


@BUDGET
@given(hostile_images())
def test_an_image_is_decoded_within_the_budget_or_refused_in_one_line(raw):
    from uniclr_tf.data import decode
    try:
        image = decode.decode_image(raw, max_pixels=MAX_PIXELS)
    except decode.ImageDecodeError as e:
        assert e.args[0] and "\n" not in e.args[0]
        return
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[-1] in (1, 3)
    assert image.shape[0] * image.shape[1] <= MAX_PIXELS
    size = decode.declared_size(raw)
    assert size is not None and size.pixels <= MAX_PIXELS


@BUDGET
@given(hostile_images())
def test_the_tf_data_budget_says_what_the_python_rule_says(raw):
    from uniclr_tf.data import decode
    code, reason = decode.budget_status(raw, MAX_PIXELS)
    try:
        decode.check_budget(raw, MAX_PIXELS)
        assert code == 0 and reason == b""
    except decode.ImageDecodeError as e:
        assert code in (1, 3) and reason.decode() == e.args[0]


@settings(max_examples=4, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(hostile_images(), min_size=1, max_size=6))
def test_a_stream_of_hostile_records_yields_images_or_names_each_bad_one(images):
    import tensorflow as tf

    from uniclr_tf.data import stream
    names = [f"record{i}" for i in range(len(images))]
    records = tf.data.Dataset.from_tensor_slices((tf.constant(images, tf.string), tf.constant(names)))
    bad = stream.BadFiles()
    ds = stream.decode_records(records, lambda raw, name: (raw, tf.constant(0, tf.int64), name),
                               lambda raw, name: (tf.constant(0, tf.int64), name), (8, 8, 3), True, bad,
                               max_pixels=MAX_PIXELS)
    kept = sum(1 for _ in ds)
    assert kept + len(bad.names()) == len(images)


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2 ** 70, 2 ** 70) | st.floats() |
                           st.text(max_size=12), lambda inner: st.lists(inner, max_size=3) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=8)


@st.composite
def hostile_states(draw):
    state = {"epoch": 1, "step": 5, "weights": "weights-000000005.npz", "reason": "epoch"}
    for key in draw(st.lists(st.sampled_from(["epoch", "step", "weights", "reason", "previous", "extra"]),
                             max_size=4)):
        state[key] = draw(json_values | st.integers(-3, 12))
    return draw(st.sampled_from([state, draw(json_values)]))


@BUDGET
@given(hostile_states())
def test_a_backup_state_is_used_only_when_its_schema_holds(state):
    from uniclr_tf.training import backup
    try:
        backup.check_state(state)
    except ValueError as e:
        assert "\n" not in str(e)
        return
    assert all(type(state[k]) is int for k in ("epoch", "step")) and 0 <= state["epoch"] <= state["step"]
    assert state["weights"] == f"weights-{state['step']:09d}.npz" or state["weights"].endswith(f"{state['step']}.npz")


@pytest.fixture(scope="module")
def backup_folder(tmp_path_factory):
    from uniclr_tf.training import backup
    folder = tmp_path_factory.mktemp("fuzz_backup")
    for step in (3, 5):
        backup.write(str(folder), [("w", np.full((2,), step, np.float32))], epoch=step // 3, step=step,
                     reason="epoch")
    return folder


@BUDGET
@given(hostile_states())
def test_a_hostile_state_file_resumes_from_an_intact_backup_or_names_the_file(backup_folder, state):
    from uniclr_tf.training import backup, runs
    (backup_folder / backup.BACKUP_DIR / backup.STATE_FILE).write_text(json.dumps(state))
    try:
        found = backup.latest(str(backup_folder))
    except runs.RunFolderError as e:
        assert "\n" not in str(e)
        return
    assert (found["epoch"], found["step"], found["weights"]) in ((1, 5, "weights-000000005.npz"),
                                                                 (1, 3, "weights-000000003.npz"))


def _standin():
    import importlib.util

    from tests.conftest import REPO_ROOT
    spec = importlib.util.spec_from_file_location("standin_fuzz", REPO_ROOT / "export" / "standin_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz_server():
    import tensorflow as tf

    from tests.test_hostile import _Signature
    standin = _standin()
    standin.READ_TIMEOUT_S = 1.0  # the clients send at once: a body that is short waits this long
    servable = standin.Servable.__new__(standin.Servable)
    servable.tf, servable.name, servable.version, servable._metadata = tf, "uniclr", 1, None
    servable.signatures = {"serving_default": _Signature(tf, [])}
    servable.limits = dict(max_batch_size=16, max_pixels=16 * 64, train_pixels=16)
    with standin.StandinServer(None, servable=servable, workers=2, max_body_mb=0.05) as server:
        yield server.httpd.server_address[1]


request_bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"instances": json_values}).map(lambda v: json.dumps(v).encode()),
    st.lists(st.lists(st.lists(st.lists(st.integers(-5, 300), min_size=1, max_size=2), min_size=1, max_size=9),
                      min_size=1, max_size=9), min_size=1, max_size=20).map(
        lambda v: json.dumps({"instances": v}).encode()))


@BUDGET
@given(request_bodies, st.sampled_from(["", "declared", "short", "bad"]))
def test_every_request_body_gets_a_json_answer_of_2xx_or_4xx(fuzz_server, body, length):
    import socket
    header = {"": f"Content-Length: {len(body)}", "declared": f"Content-Length: {len(body)}",
              "short": f"Content-Length: {len(body) + 5}", "bad": "Content-Length: x1"}[length]
    with socket.create_connection(("127.0.0.1", fuzz_server), timeout=10) as s:
        s.sendall(b"POST /v1/models/uniclr:predict HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                  + header.encode() + b"\r\n\r\n" + body)
        reply = b""
        while True:
            try:
                more = s.recv(65536)
            except OSError:
                break
            if not more:
                break
            reply += more
    if length == "short":  # the body never arrives whole: dropped at the timeout, or answered
        assert reply == b"" or reply.startswith(b"HTTP/1.1 ")
        return
    head, _, payload = reply.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert status in (200, 400, 404, 411, 413), reply[:300]
    answer = json.loads(payload)
    if status != 200:
        assert isinstance(answer["error"], str) and "\n" not in answer["error"]


@BUDGET
@given(st.binary(max_size=2000))
def test_the_tfrecord_framing_walk_answers_for_any_file(tmp_path_factory, raw):
    from uniclr_tf.data import stream
    path = tmp_path_factory.mktemp("records", numbered=True) / "x.tfrecord"
    path.write_bytes(raw)
    records, problem, offset = stream.check_tfrecord_file(str(path))
    assert records >= 0 and 0 <= offset <= len(raw)
    assert problem is None or "\n" not in problem
    if problem is None:
        at = 0
        for _ in range(records):
            (length,) = struct.unpack("<Q", raw[at:at + 8])
            at += 16 + length
        assert at == len(raw)
