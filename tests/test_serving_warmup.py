"""TensorFlow Serving warm-up requests (`inference.serving_warmup`): written as TF Serving reads them, answered by
the export's signature as the in-process translator answers them, kept by a re-export, chosen from the run's
validation data by default, and refused or skipped with a message when they cannot be written."""

import contextlib
import io
import json
import logging
import os
import shutil

import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorflow_serving")

from keras_transformer import cli  # noqa: E402
from keras_transformer.data.corpora import read_lines  # noqa: E402
from keras_transformer.inference import serving_warmup  # noqa: E402
from keras_transformer.inference.saved_model import export_saved_model  # noqa: E402
from keras_transformer.inference.serving_warmup import (  # noqa: E402
    DEFAULT_WARMUP_SIZES,
    read_warmup_requests,
    run_validation_sources,
    warmup_path,
    warmup_requests,
    write_warmup_requests,
)
from keras_transformer.inference.translator import Translator  # noqa: E402

EXTRA = 3  # short outputs: the tiny model is untrained


def test_requests_take_the_sentences_in_order_and_cycle():
    assert warmup_requests(["a", "b", "c"], sizes=(1, 4, 2)) == [["a"], ["a", "b", "c", "a"], ["a", "b"]]
    assert [len(r) for r in warmup_requests(["x"])] == list(DEFAULT_WARMUP_SIZES)


@pytest.mark.parametrize(
    "sentences, sizes, message",
    [
        ([], (1,), "at least one sentence"),
        (["ok", b"bytes"], (1,), "sentence 1 is a bytes"),
        (["ok"], (0,), "positive integers, got 0"),
        (["ok"], (True,), "positive integers, got True"),
        (["ok"], (), "1 to 1000 sizes"),
        (["ok"], (1,) * 1001, "refuses to load a version with more than 1000 records"),
    ],
)
def test_bad_requests_are_refused(sentences, sizes, message):
    with pytest.raises(ValueError, match=message):
        warmup_requests(sentences, sizes)


def test_records_are_the_prediction_logs_tf_serving_replays(tmp_path):
    from tensorflow_serving.apis import prediction_log_pb2

    sentences = ["A dog runs.", "Ein Hund läuft – schnell 🐕"]
    path = write_warmup_requests(tmp_path, sentences, sizes=(1, 3))
    assert path == os.path.join(str(tmp_path), "assets.extra", "tf_serving_warmup_requests")
    records = list(tf.data.TFRecordDataset(path).as_numpy_iterator())
    assert len(records) == 2
    request = prediction_log_pb2.PredictionLog.FromString(records[1]).predict_log.request
    assert request.model_spec.signature_name == "serving_default"
    assert request.inputs["inputs"].dtype == tf.string.as_datatype_enum
    assert [d.size for d in request.inputs["inputs"].tensor_shape.dim] == [3]
    assert read_warmup_requests(tmp_path) == [
        ("serving_default", sentences[:1]),
        ("serving_default", sentences + sentences[:1]),
    ]
    assert read_warmup_requests(tmp_path / "elsewhere") == []


@pytest.fixture(scope="module")
def warmed_export(tiny_run_dir, tmp_path_factory):
    base = tmp_path_factory.mktemp("warmed") / "tiny"
    sentences = read_lines("val", "en")[:5]
    return export_saved_model(
        tiny_run_dir, str(base), max_extra_length=EXTRA, dtype="float32", warmup_sentences=sentences
    ), sentences


def test_export_writes_requests_its_signature_answers_as_the_translator(tiny_run_dir, warmed_export):
    from tensorflow_serving.apis import prediction_log_pb2

    export_dir, sentences = warmed_export
    assert read_warmup_requests(export_dir) == [("serving_default", r) for r in warmup_requests(sentences)]
    # Replayed as TF Serving replays them: each record's signature, fed by the record's own input keys, which
    # must be the signature's.
    loaded = tf.saved_model.load(export_dir)
    translator = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA)
    for record in list(tf.data.TFRecordDataset(warmup_path(export_dir)).as_numpy_iterator())[:3]:
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        signature = loaded.signatures[request.model_spec.signature_name]
        assert set(request.inputs) == set(signature.structured_input_signature[1])
        served = signature(**{key: tf.constant(tf.make_ndarray(value)) for key, value in request.inputs.items()})
        request_sentences = [s.decode("utf-8") for s in tf.make_ndarray(request.inputs["inputs"])]
        assert [t.decode("utf-8") for t in served["translations"].numpy()] == translator.translate(request_sentences)


def test_a_failed_warmup_write_leaves_no_version(tiny_run_dir, tmp_path, monkeypatch):
    def fail(version_dir, sentences, sizes):
        raise OSError("disk full")

    monkeypatch.setattr(serving_warmup, "write_warmup_requests", fail)
    base = tmp_path / "failed"
    with pytest.raises(OSError, match="disk full"):
        export_saved_model(
            tiny_run_dir, str(base), max_extra_length=EXTRA, dtype="float32", warmup_sentences=["A dog."]
        )
    assert os.listdir(base) == []  # neither the version nor its temporary directory


def test_bad_sentences_are_refused_before_the_model_is_loaded(tmp_path):
    with pytest.raises(ValueError, match="sentence 0 is a int"):
        export_saved_model(str(tmp_path / "no_run"), str(tmp_path / "out"), warmup_sentences=[3])


def test_reexport_keeps_the_requests_unless_told(warmed_export, tmp_path):
    export_dir, _ = warmed_export
    with open(warmup_path(export_dir), "rb") as f:
        original = f.read()
    again = export_saved_model(export_dir, str(tmp_path / "again"))
    with open(warmup_path(again), "rb") as f:
        assert f.read() == original
    assert not os.path.exists(
        warmup_path(export_saved_model(export_dir, str(tmp_path / "none"), warmup_sentences=None))
    )
    other = export_saved_model(export_dir, str(tmp_path / "other"), warmup_sentences=["Two men."])
    assert read_warmup_requests(other)[0] == ("serving_default", ["Two men."])
    # In place, over the version it reads from.
    base = os.path.dirname(other)
    export_saved_model(other, base, version=1, overwrite=True)
    assert read_warmup_requests(other)[0] == ("serving_default", ["Two men."])


def test_auto_takes_the_run_s_validation_sentences(tiny_run_dir, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir, run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "data": {"spec": "multi30k", "src": "en", "tgt": "de"}}))
    path = export_saved_model(str(run), str(tmp_path / "auto"), max_extra_length=EXTRA, dtype="float32")
    validation = read_lines("val", "en")
    assert [r for _, r in read_warmup_requests(path)] == warmup_requests(validation[: max(DEFAULT_WARMUP_SIZES)])


def test_auto_without_validation_data_writes_none_and_says_why(tiny_run_dir, tmp_path, caplog):
    logger = "keras_transformer.inference.serving_warmup"
    with caplog.at_level(logging.INFO, logger=logger):
        path = export_saved_model(tiny_run_dir, str(tmp_path / "auto"), max_extra_length=EXTRA, dtype="float32")
    assert not os.path.exists(warmup_path(path))
    assert f"no validation data of {tiny_run_dir} can be read here" in caplog.text
    assert "--warmup-sentences" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=logger):
        assert serving_warmup.warmup_for_export("auto", path) is None  # an export without them
        assert serving_warmup.warmup_for_export("auto", Translator.from_run_dir(tiny_run_dir)) is None
    assert "is not a run directory, nor an export with warm-up requests" in caplog.text
    assert "a Translator has no run directory" in caplog.text
    # Data that cannot be read does not fail the export: a warning says why.
    files = f"files:{tmp_path}/{{split}}.{{src}},{tmp_path}/{{split}}.{{tgt}}"
    (tmp_path / "val.en").write_text("one\ntwo\n")
    (tmp_path / "val.fr").write_text("un\n")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logger):
        assert (
            serving_warmup.warmup_for_export("auto", _config(tmp_path, {"spec": files, "src": "en", "tgt": "fr"}))
            is None
        )
    assert "could not be read" in caplog.text


def _config(tmp_path, data, training=None):
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "config.json").write_text(json.dumps({"data": data, "training": training or {}}))
    return str(run)


def test_validation_sources_of_the_run_s_data(tmp_path):
    assert (
        run_validation_sources(_config(tmp_path, {"spec": "multi30k", "src": "en", "tgt": "de"}))
        == read_lines("val", "en")[: max(DEFAULT_WARMUP_SIZES)]
    )
    assert (
        run_validation_sources(_config(tmp_path, {"spec": "multi30k", "src": "de", "tgt": "en"}), limit=2)
        == read_lines("val", "de")[:2]
    )
    # The run's own validation split.
    assert (
        run_validation_sources(
            _config(tmp_path, {"spec": "multi30k", "src": "en", "tgt": "de"}, {"validation_split": "test2016"}), limit=3
        )
        == read_lines("test2016", "en")[:3]
    )
    files = f"files:{tmp_path}/{{split}}.{{src}},{tmp_path}/{{split}}.{{tgt}}"
    assert run_validation_sources(_config(tmp_path, {"spec": files, "src": "en", "tgt": "fr"})) is None  # no files
    (tmp_path / "val.en").write_text("one\ntwo\n")
    (tmp_path / "val.fr").write_text("un\ndeux\n")
    assert run_validation_sources(_config(tmp_path, {"spec": files, "src": "en", "tgt": "fr"})) == ["one", "two"]
    # TensorFlow Datasets could download: not read. A run without data, or no run: None.
    assert run_validation_sources(_config(tmp_path, {"spec": "tfds:wmt14_translate/de-en"})) is None
    assert run_validation_sources(_config(tmp_path, {})) is None
    assert (
        run_validation_sources(
            _config(tmp_path, {"spec": "multi30k", "src": "en", "tgt": "de"}, {"validation_split": None})
        )
        is None
    )  # trained without validation
    with pytest.raises(FileNotFoundError, match="no config.json"):
        run_validation_sources(tmp_path / "missing")


def test_without_tensorflow_serving_api(tiny_run_dir, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(serving_warmup, "_serving_api_installed", lambda: False)
    with pytest.raises(ImportError, match="pip install tensorflow-serving-api"):
        serving_warmup.warmup_for_export(["A dog."], tiny_run_dir)
    with pytest.raises(ImportError, match="needs the package tensorflow-serving-api"):
        write_warmup_requests(tmp_path / "w", ["A dog."])
    assert not os.path.exists(tmp_path / "w")
    multi30k_run = _config(tmp_path, {"spec": "multi30k", "src": "en", "tgt": "de"})
    with caplog.at_level(logging.WARNING, logger="keras_transformer.inference.serving_warmup"):
        assert serving_warmup.warmup_for_export("auto", multi30k_run) is None
    assert "needs the package tensorflow-serving-api" in caplog.text
    with pytest.raises(ValueError, match="'auto', None or a list"):
        serving_warmup.warmup_for_export("always", tiny_run_dir)


def test_cli_flags(tiny_run_dir, tmp_path):
    sentences = tmp_path / "warmup.en"
    sentences.write_text("A dog runs.\n\nTwo men talk.\n", encoding="utf-8")
    base = str(tmp_path / "cli")
    common = ["export", tiny_run_dir, "--output", base, "--max-extra-length", str(EXTRA), "--precision", "float32"]
    with contextlib.redirect_stdout(io.StringIO()):
        assert cli.main(common + ["--version", "1", "--warmup-sentences", str(sentences)]) == 0
        assert cli.main(common + ["--version", "2", "--no-warmup"]) == 0
    requests = read_warmup_requests(os.path.join(base, "1"))
    assert requests[1] == ("serving_default", ["A dog runs.", "Two men talk."] * 4)  # blank lines skipped
    assert not os.path.exists(warmup_path(os.path.join(base, "2")))
    (tmp_path / "blank.en").write_text("\n \n")
    with pytest.raises(SystemExit, match="has no sentences"):
        cli.main(common + ["--warmup-sentences", str(tmp_path / "blank.en")])
    with pytest.raises(SystemExit, match="missing.en"):
        cli.main(common + ["--warmup-sentences", str(tmp_path / "missing.en")])
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
        cli.main(common + ["--warmup-sentences", str(sentences), "--no-warmup"])


def test_requests_stay_within_the_model_s_request_limit(tiny_run_dir, tmp_path):
    """TF Serving does not load a version whose warm-up requests fail: a model that takes at most 32
    sentences per request gets the sizes 1 and 8 only, and answers each of them."""
    assert serving_warmup.sizes_within(32) == [1, 8] and serving_warmup.sizes_within(1024) == [1, 8, 64, 256]
    assert serving_warmup.sizes_within(4) == [1] and serving_warmup.sizes_within(1, sizes=(8, 64)) == [1]
    translator = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA, max_batch_size=32)
    export_dir = export_saved_model(translator, str(tmp_path / "limited"), warmup_sentences=["A dog runs."])
    requests = read_warmup_requests(export_dir)
    assert [len(sentences) for _, sentences in requests] == [1, 8]
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]
    for _, sentences in requests:
        assert signature(inputs=tf.constant(sentences))["translations"].shape == [len(sentences)]
