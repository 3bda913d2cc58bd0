"""SavedModel export for TensorFlow Serving: strings in, translations out.

One tiny run directory (SentencePiece vocabulary of 400 trained on 2000
Multi30k pairs, an untrained tiny Transformer with max_length 32, laid out as
`keras_transformer.training` writes it) is exported once; a fresh Python
process that imports only `tensorflow` and `tensorflow_text` loads it and runs
`serving_default` on every case below, and its answers are compared with the
in-process `Translator`'s.
"""

import base64
import contextlib
import io
import json
import os
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import TINY_RUN_MAX_LENGTH as MAX_LENGTH  # longer sources are truncated to this many tokens
from conftest import TINY_RUN_VOCAB as VOCAB

from keras_transformer import cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.inference.saved_model import (
    PYTHON_OPS,
    export_saved_model,
    list_versions,
    saved_model_ops,
)
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import (
    TOKENIZER_FILENAME,
    build_model,
    checkpoint_path,
    load_run,
    model_config_of_run,
    save_model_weights,
)

EXTRA = 10  # max_extra_length at export (50 in the paper; small to keep the test fast)
BIN = os.path.dirname(sys.executable)

# The only ops that may be missing from core TensorFlow: tensorflow-text's SentencePiece
# ops, which the tensorflow/serving binary links (tensorflow_text:ops_lib); the last one
# names the subwords of the alignments (`translate_with_alignments`).
TEXT_OPS = {"SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp", "SentencepieceIdToStringOp"}


def _bytes(items):
    return [s.encode("utf-8") if isinstance(s, str) else s for s in items]


def _cases():
    test = read_lines("test2016", "en")
    long_text = " ".join(test[:40])  # ~500 tokens, far beyond MAX_LENGTH
    return {
        "batch": _bytes(test[:8]),
        "empty_string": _bytes(["", "   ", "A dog runs on the beach.", "\t\n"]),
        "long": _bytes([long_text, "A dog.", ("A dog runs. " * 200).strip()]),
        "invalid_utf8": [b"A dog \xff\xfe runs.", b"\xc3\x28", b"\x80\x80\x80", b"Two men \xe2\x82 talk."],
        "empty_batch": [],
        "batch_256": _bytes(test[:256]),
    }


# Runs in a fresh interpreter: only tensorflow and tensorflow_text, as a model server would have.
_SERVE_SCRIPT = r"""
import base64, hashlib, json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.framework import op_def_registry

export_dir, cases_path = sys.argv[1], sys.argv[2]
proto = saved_model_pb2.SavedModel()
with open(os.path.join(export_dir, "saved_model.pb"), "rb") as f:
    proto.ParseFromString(f.read())
ops = set()
for meta_graph in proto.meta_graphs:
    ops.update(n.op for n in meta_graph.graph_def.node)
    for function in meta_graph.graph_def.library.function:
        ops.update(n.op for n in function.node_def)
not_core = sorted(op for op in ops if op_def_registry.get(op) is None)

import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

unregistered = sorted(op for op in ops if op_def_registry.get(op) is None)
loaded = tf.saved_model.load(export_dir)
serve = loaded.signatures["serving_default"]
with open(cases_path) as f:
    cases = json.load(f)
results = {}
for name, items in cases.items():
    inputs = tf.constant([base64.b64decode(s) for s in items], tf.string, shape=[len(items)])
    out = serve(inputs=inputs)
    results[name] = {
        "translations": [base64.b64encode(t).decode() for t in out["translations"].numpy()],
        "scores": out["scores"].numpy().tolist(),
        "shapes": {k: v.shape.as_list() for k, v in out.items()},
        "dtypes": {k: v.dtype.name for k, v in out.items()},
    }
# TensorFlow Serving loads a SavedModel into a Session: restore op, init op, then
# Session::Run on the signature's tensor names. tf.compat.v1's loader does the same.
import numpy as np
session_results = {}
with tf.Graph().as_default() as graph, tf.compat.v1.Session(graph=graph) as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    fetches = {key: info.name for key, info in signature.outputs.items()}
    for name, items in cases.items():
        feed = np.array([base64.b64decode(s) for s in items] or [], dtype=object).reshape([len(items)])
        out = session.run(fetches, {signature.inputs["inputs"].name: feed})
        session_results[name] = {
            "translations": [base64.b64encode(t).decode() for t in out["translations"]],
            "scores": out["scores"].tolist(),
        }
asset = loaded.sentencepiece_model.asset_path.numpy().decode()
with open(asset, "rb") as f:
    asset_sha = hashlib.sha256(f.read()).hexdigest()
print(json.dumps({
    "not_core": not_core,
    "unregistered": unregistered,
    "results": results,
    "session_results": session_results,
    "inputs": sorted(serve.structured_input_signature[1]),
    "outputs": sorted(serve.structured_outputs),
    "asset": asset,
    "asset_sha": asset_sha,
    "imported_keras_transformer": "keras_transformer" in sys.modules,
}))
"""


@pytest.fixture(scope="module")
def run_dir(tiny_run_dir):
    return tiny_run_dir


@pytest.fixture(scope="module")
def translator(run_dir):
    return Translator.from_run_dir(run_dir, max_extra_length=EXTRA)


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("saved_models") / "tiny"
    # float32: compared with in-process float32 translators below (the default "auto": test_decoding_precision.py).
    return export_saved_model(run_dir, str(base), max_extra_length=EXTRA, dtype="float32")


def _serve_in_fresh_process(export_dir, cases, cases_path):
    """What a fresh tensorflow + tensorflow_text process answers for each case of `cases` (name -> bytes)."""
    cases_path.write_text(
        json.dumps({name: [base64.b64encode(s).decode() for s in items] for name, items in cases.items()})
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", _SERVE_SCRIPT, export_dir, str(cases_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for results in (out["results"], out["session_results"]):
        for result in results.values():
            result["translations"] = [base64.b64decode(t) for t in result["translations"]]
    return out


@pytest.fixture(scope="module")
def served(exported, tmp_path_factory):
    """What a fresh tensorflow + tensorflow_text process answers for every case."""
    return _serve_in_fresh_process(exported, _cases(), tmp_path_factory.mktemp("cases") / "cases.json")


def _in_process(translator, items):
    out = translator.translate_strings(tf.constant(items, tf.string, shape=[len(items)]))
    return list(out["translations"].numpy()), out["scores"].numpy()


def _assert_same(translator, served, name):
    items = _cases()[name]
    result = served["results"][name]
    expected_translations, expected_scores = _in_process(translator, items)
    assert result["shapes"] == {"translations": [len(items)], "scores": [len(items)]}
    assert result["dtypes"] == {"translations": "string", "scores": "float32"}
    assert result["translations"] == expected_translations
    np.testing.assert_allclose(result["scores"], expected_scores, rtol=1e-5, atol=1e-5)
    return result


def _read_export_info(export_dir):
    with open(os.path.join(export_dir, "assets", "export.json")) as f:
        return json.load(f)


def _check_score_definition(text):
    """export.json says what a score is: log P / GNMT's length penalty, |Y| with the end token."""
    assert "log P(Y|X) / ((5 + |Y|) / 6) ** alpha" in text and "end token" in text


def test_layout_and_asset(exported, run_dir, served):
    assert exported.endswith(os.sep + "1")
    assert sorted(os.listdir(exported)) == ["assets", "fingerprint.pb", "saved_model.pb", "variables"]
    assert os.listdir(os.path.join(exported, "variables"))
    with open(os.path.join(run_dir, "spm.model"), "rb") as f:
        spm_bytes = f.read()
    with open(os.path.join(exported, "assets", TOKENIZER_FILENAME), "rb") as f:
        assert f.read() == spm_bytes
    with open(os.path.join(exported, "assets", "export.json")) as f:
        info = json.load(f)
    _check_score_definition(info["decoding"].pop("score"))
    assert info["decoding"] == {
        "beam_size": 4,
        "alpha": 0.6,
        "max_extra_length": EXTRA,
        "max_input_length": MAX_LENGTH,
        "max_input_bytes": 64 * MAX_LENGTH,
        "early_stopping": "exact",
        "max_batch_size": 1024,
    }
    assert info["precision"] == "float32"
    # This run directory was made by hand, without training options (a trained one's are recorded:
    # test_train_multi30k_example_runs_and_prints_bleu).
    assert "training" not in json.loads(open(os.path.join(run_dir, "config.json")).read())
    assert "training" not in info and "metadata" not in info
    # The loaded SavedModel's Asset points at its own assets/ copy.
    import hashlib

    assert served["asset"] == os.path.join(exported, "assets", TOKENIZER_FILENAME)
    assert served["asset_sha"] == hashlib.sha256(spm_bytes).hexdigest()


def test_fresh_process_matches_translator(translator, served):
    assert served["imported_keras_transformer"] is False
    assert served["inputs"] == ["inputs"]
    assert served["outputs"] == ["scores", "translations"]
    result = _assert_same(translator, served, "batch")
    assert all(result["translations"])  # non-empty input, non-empty output (even untrained)
    # The Python convenience API agrees too.
    texts = [s.decode() for s in _cases()["batch"]]
    assert translator.translate(texts) == [t.decode("utf-8") for t in result["translations"]]


def test_session_loader_as_tf_serving(served):
    """The Session-based loading of TensorFlow Serving (and saved_model_cli run) gives the same answers."""
    assert sorted(served["session_results"]) == sorted(served["results"])
    for name, result in served["results"].items():
        session = served["session_results"][name]
        assert session["translations"] == result["translations"], name
        np.testing.assert_allclose(session["scores"], result["scores"], rtol=1e-5, atol=1e-5)


def test_only_serving_ops(exported, served):
    ops = saved_model_ops(exported)
    assert not ops & PYTHON_OPS
    assert {"While", "SentencepieceOp", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"} <= ops
    # Seen from a process that had not imported tensorflow_text yet: only its
    # SentencePiece ops are not core TensorFlow, and importing it registers them.
    assert set(served["not_core"]) <= TEXT_OPS
    assert served["unregistered"] == []


def test_empty_strings(translator, served):
    result = _assert_same(translator, served, "empty_string")
    assert result["translations"][0] == b"" and result["scores"][0] == 0.0
    assert result["translations"][1] == b"" and result["scores"][1] == 0.0
    assert result["translations"][3] == b"" and result["scores"][3] == 0.0
    assert result["translations"][2] != b""


def test_long_input_truncated_and_bounded(translator, served):
    tokenizer = translator.tokenizer
    items = _cases()["long"]
    assert len(tokenizer.encode(items[0].decode())) > 10 * MAX_LENGTH
    result = _assert_same(translator, served, "long")
    # At most MAX_LENGTH + EXTRA tokens out: bound the bytes by the longest piece.
    longest_piece = max(len(p.replace("\u2581", " ").encode()) for p in tokenizer.pieces(list(range(VOCAB))))
    for text in result["translations"]:
        assert len(text) <= (MAX_LENGTH + EXTRA) * longest_piece
    # Truncation: the long input translates as its first MAX_LENGTH - 1 tokens (+ EOS) do.
    ids = tokenizer.encode(items[2].decode())
    prefix = tokenizer.detokenize(tf.constant(ids[: MAX_LENGTH - 1])).numpy()
    assert tokenizer.encode(prefix.decode()) == ids[: MAX_LENGTH - 1]
    truncated, _ = _in_process(translator, [prefix])
    assert result["translations"][2] == truncated[0]


def test_invalid_utf8_replaced(translator, served):
    result = _assert_same(translator, served, "invalid_utf8")
    for text in result["translations"]:
        text.decode("utf-8")  # valid UTF-8 out
    # Same answer as for the text with U+FFFD in place of the bad bytes.
    replaced = [s.decode("utf-8", "replace") for s in _cases()["invalid_utf8"]]
    expected, _ = _in_process(translator, _bytes(replaced))
    assert result["translations"] == expected


def test_empty_batch(served):
    result = served["results"]["empty_batch"]
    assert result["shapes"] == {"translations": [0], "scores": [0]}
    assert result["translations"] == [] and result["scores"] == []


def test_batch_of_256(translator, served):
    result = _assert_same(translator, served, "batch_256")
    assert len(result["translations"]) == 256


def test_saved_model_cli_show(exported):
    proc = subprocess.run(
        [
            os.path.join(BIN, "saved_model_cli"),
            "show",
            "--dir",
            exported,
            "--tag_set",
            "serve",
            "--signature_def",
            "serving_default",
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "inputs['inputs'] tensor_info:\n      dtype: DT_STRING\n      shape: (-1)" in out
    assert "outputs['translations'] tensor_info:\n      dtype: DT_STRING\n      shape: (-1)" in out
    assert "outputs['scores'] tensor_info:\n      dtype: DT_FLOAT\n      shape: (-1)" in out
    assert "Method name is: tensorflow/serving/predict" in out


def test_versions_and_overwrite(translator, tmp_path):
    base = str(tmp_path / "model")
    first = export_saved_model(translator, base)
    second = export_saved_model(translator, base)
    assert (first, second) == (os.path.join(base, "1"), os.path.join(base, "2"))
    assert export_saved_model(translator, base, version=7) == os.path.join(base, "7")
    assert export_saved_model(translator, base) == os.path.join(base, "8")
    with pytest.raises(FileExistsError, match="already exists"):
        export_saved_model(translator, base, version=2)
    assert export_saved_model(translator, base, version=2, overwrite=True) == os.path.join(base, "2")
    assert list_versions(base) == [1, 2, 7, 8]
    assert sorted(os.listdir(base)) == ["1", "2", "7", "8"]  # no temporary directory left behind
    # A Translator with other decoding options is exported with them.
    greedy = export_saved_model(translator, base, beam_size=1)
    with open(os.path.join(greedy, "assets", "export.json")) as f:
        assert json.load(f)["decoding"]["beam_size"] == 1


def test_cli_export(run_dir, tmp_path):
    base = str(tmp_path / "cli_model")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert (
            cli.main(
                ["export", run_dir, "--output", base, "--version", "5", "--beam", "2", "--max-extra-length", str(EXTRA)]
            )
            == 0
        )
    assert stdout.getvalue().strip().splitlines()[-1] == os.path.join(base, "5")
    with open(os.path.join(base, "5", "assets", "export.json")) as f:
        info = json.load(f)
    assert info["decoding"]["beam_size"] == 2
    # The flags left out take §6.1's values, and train's float32 for a run directory.
    assert (info["decoding"]["alpha"], info["decoding"]["early_stopping"]) == (0.6, "exact")
    assert (info["precision"], info["precision_choice"]) == ("float32", None)
    # An existing version is a clear error, not a traceback.
    with pytest.raises(SystemExit, match="already exists"):
        cli.main(["export", run_dir, "--output", base, "--version", "5"])
    with pytest.raises(SystemExit, match="no such run directory"):
        cli.main(["export", str(tmp_path / "missing"), "--output", base])
    assert list_versions(base) == [5]


def test_export_applies_and_records_every_decoding_option(run_dir, tmp_path):
    """early_stopping, beam, alpha, max input length, checkpoint and precision: in export.json and in the
    answers of the SavedModel, which are those of an in-process Translator with the same options."""
    run = str(tmp_path / "run")
    shutil.copytree(run_dir, run)
    # A checkpoint with other weights than model.keras: --checkpoint latest exports it.
    keras.utils.set_random_seed(7)
    os.makedirs(os.path.join(run, "checkpoints"))
    other = build_model(model_config_of_run(run))
    other.compile()
    save_model_weights(other, checkpoint_path(os.path.join(run, "checkpoints"), 3))
    base = str(tmp_path / "models")

    # The library passes early_stopping and the precision through, and keeps what the caller knows about
    # the model (the demo: its scores and machine) as given.
    metadata = {"test2016": {"bleu": 12.5}, "machine": {"cpu": "some CPU"}}
    first = export_saved_model(
        run,
        base,
        version=1,
        max_extra_length=EXTRA,
        early_stopping="k_finished",
        dtype="mixed_bfloat16",
        metadata=metadata,
    )
    info = _read_export_info(first)
    assert info.pop("metadata") == metadata
    _check_score_definition(info["decoding"].pop("score"))
    assert info["decoding"] == {
        "beam_size": 4,
        "alpha": 0.6,
        "max_extra_length": EXTRA,
        "max_input_length": MAX_LENGTH,
        "max_input_bytes": 64 * MAX_LENGTH,
        "early_stopping": "k_finished",
        "max_batch_size": 1024,
    }
    assert info["precision"] == "mixed_bfloat16"
    with pytest.raises(FileExistsError, match="already exists"):
        export_saved_model(run, base, version=1)

    # The command: an existing version needs --overwrite, which replaces it.
    argv = [
        "export",
        run,
        "--output",
        base,
        "--version",
        "1",
        "--beam",
        "2",
        "--alpha",
        "0.3",
        "--max-extra-length",
        str(EXTRA),
        "--max-input-length",
        "8",
        "--max-input-bytes",
        "300",
        "--early-stopping",
        "k_finished",
        "--checkpoint",
        "latest",
        "--precision",
        "float32",
    ]
    with pytest.raises(SystemExit, match="already exists"):
        cli.main(argv)
    assert _read_export_info(first)["precision"] == "mixed_bfloat16"  # left alone
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(argv + ["--overwrite"]) == 0
    assert stdout.getvalue().strip().splitlines()[-1] == first
    assert sorted(os.listdir(base)) == ["1"]  # replaced, no temporary directory left behind
    info = _read_export_info(first)
    _check_score_definition(info["decoding"].pop("score"))
    assert info["decoding"] == {
        "beam_size": 2,
        "alpha": 0.3,
        "max_extra_length": EXTRA,
        "max_input_length": 8,
        "max_input_bytes": 300,
        "early_stopping": "k_finished",
        "max_batch_size": 1024,
    }
    assert info["precision"] == "float32" and info["source"] == run

    # Served by a fresh process: the answers of Translator(checkpoint, same options).
    test = read_lines("test2016", "en")
    items = _bytes([test[0], "", test[1] + " " + test[2], "A dog."])
    model, tokenizer = load_run(run, checkpoint="latest")
    options = dict(
        beam_size=2,
        alpha=0.3,
        max_extra_length=EXTRA,
        max_input_length=8,
        max_input_bytes=300,
        early_stopping="k_finished",
    )
    expected_translations, expected_scores = _in_process(Translator(model, tokenizer, **options), items)
    served = _serve_in_fresh_process(first, {"options": items}, tmp_path / "cases.json")
    for result in (served["results"]["options"], served["session_results"]["options"]):
        assert result["translations"] == expected_translations
        np.testing.assert_allclose(result["scores"], expected_scores, rtol=1e-5, atol=1e-5)
    # Each option shows in those answers.
    final_model = Translator.from_run_dir(run, **options)  # model.keras instead of the checkpoint
    assert not np.allclose(_in_process(final_model, items)[1], expected_scores, atol=1e-3)
    untruncated = Translator(model, tokenizer, **dict(options, max_input_length=None))
    assert not np.allclose(_in_process(untruncated, items[2:3])[1], expected_scores[2:3], atol=1e-3)
    other_alpha = Translator(model, tokenizer, **dict(options, alpha=0.6))
    assert not np.allclose(_in_process(other_alpha, items)[1], expected_scores, atol=1e-3)
    other_beam = Translator(model, tokenizer, **dict(options, beam_size=4))
    assert not np.allclose(_in_process(other_beam, items)[1], expected_scores, atol=1e-3)


# The example client against stand-ins for TensorFlow Serving that run the exported signature.


def _client():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "serving_client.py")
    spec = importlib.util.spec_from_file_location("serving_client", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _grpc_stand_in(serve):
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("tensorflow_serving")
    from concurrent import futures

    from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

    class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
        def Predict(self, request, context):
            assert request.model_spec.name == "tiny"
            assert request.model_spec.signature_name == "serving_default"
            outputs = serve(inputs=tf.constant(tf.make_ndarray(request.inputs["inputs"])))
            response = predict_pb2.PredictResponse()
            response.model_spec.CopyFrom(request.model_spec)
            for key, value in outputs.items():
                response.outputs[key].CopyFrom(tf.make_tensor_proto(value.numpy()))
            return response

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(), server)
    port = server.add_insecure_port("localhost:0")
    server.start()
    return server, port


def _rest_stand_in(serve):
    """POST /v1/models/tiny:predict, columnar ({"inputs"} -> {"outputs"}) as TF Serving's REST API."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            assert self.path == "/v1/models/tiny:predict", self.path
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            inputs = request["inputs"]["inputs"]
            outputs = serve(inputs=tf.constant([s.encode() for s in inputs], tf.string, shape=[len(inputs)]))
            body = json.dumps(
                {
                    "outputs": {
                        "translations": [t.decode("utf-8") for t in outputs["translations"].numpy()],
                        "scores": outputs["scores"].numpy().tolist(),
                    }
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("localhost", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, server.server_address[1]


def test_serving_client(exported, translator):
    client = _client()
    serve = tf.saved_model.load(exported).signatures["serving_default"]
    sentences = [s.decode() for s in _cases()["batch"][:4]] + [""]
    expected, expected_scores = translator.translate(sentences, return_scores=True)

    rest, rest_port = _rest_stand_in(serve)
    try:
        translations, scores = client.translate_rest(sentences, port=rest_port, model="tiny")
    finally:
        rest.shutdown()
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    assert client.translate_rest([], port=rest_port, model="tiny") == ([], [])  # no request at all

    server, port = _grpc_stand_in(serve)
    try:
        translations, scores = client.translate_grpc(sentences, port=port, model="tiny")
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert client.main(["--port", str(port), "--model", "tiny", "--batch-size", "2"] + sentences) == 0
        in_flight = io.StringIO()  # three requests, two at a time: the output keeps the input's order
        with contextlib.redirect_stdout(in_flight):
            assert (
                client.main(
                    ["--port", str(port), "--model", "tiny", "--batch-size", "2", "--in-flight", "2"] + sentences
                )
                == 0
            )
    finally:
        server.stop(None)
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    assert stdout.getvalue().split("\n")[:-1] == [t.replace("\n", " ") for t in expected]
    assert in_flight.getvalue() == stdout.getvalue()
    for bad in (["--batch-size", "0"], ["--batch-size", "1025"], ["--in-flight", "0"]):
        with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
            client.main(bad + sentences)


def test_serving_client_sends_stdin_bytes_and_says_when_the_server_is_down(exported, translator, monkeypatch):
    import socket

    client = _client()
    serve = tf.saved_model.load(exported).signatures["serving_default"]
    raw = b"A dog \xff runs.\nTwo men.\n"  # invalid UTF-8: the model replaces it, the client must not fail
    expected = translator.translate(["A dog \ufffd runs.", "Two men."])
    server, port = _grpc_stand_in(serve)
    try:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(raw)))
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout):
            assert client.main(["--port", str(port), "--model", "tiny"]) == 0
    finally:
        server.stop(None)
    assert stdout.getvalue().split("\n")[:-1] == expected
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    for flags, said in ((["--rest"], "cannot reach the server"), ([], "UNAVAILABLE")):
        with pytest.raises(SystemExit, match=f"127.0.0.1:{free} .*{said}"):
            client.main(flags + ["--host", "127.0.0.1", "--port", str(free), "--timeout", "5", "A dog."])
