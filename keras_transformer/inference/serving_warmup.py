"""Warm-up requests that TensorFlow Serving replays when it loads an export, before it serves it.

TensorFlow optimizes a loaded graph and creates its kernels when the graph
first runs, so without a warm-up the first request a server answers after
loading a version waits for all of that: for a translator, many times
what the same request costs afterwards (`benchmarks/serving_warmup.py`).
TensorFlow Serving replays the records of
`<version>/assets.extra/tf_serving_warmup_requests` when it loads a version
("SavedModel Warmup"), and serves the version only afterwards. Each record is a
`tensorflow_serving.apis.PredictionLog` holding one Predict request; with more
than 1,000 records, or a request that fails, the version does not load.

`export_saved_model(..., warmup_sentences=...)` writes them with the export:
one request of each size in `DEFAULT_WARMUP_SIZES` (1, 8, 64 and 256
sentences, so the graph runs with small and large batches), its sentences
taken in order from `warmup_sentences`, again from the start when they run
out. They should be like what the server will translate: by default
(`"auto"`) an export takes the first sentences of the run's validation split
where it can read it (`run_validation_sources`), and a re-export keeps the
requests of the version it reads.

    from keras_transformer.inference.serving_warmup import write_warmup_requests
    write_warmup_requests("saved_models/multi30k_en_de/1", ["A dog runs.", "Two men are talking."])
"""

from __future__ import annotations

import logging
import os
import uuid

import tensorflow as tf

from keras_transformer.inference.signatures import INPUT_NAME, SIGNATURE_NAME

WARMUP_DIR = "assets.extra"
WARMUP_FILENAME = "tf_serving_warmup_requests"
DEFAULT_WARMUP_SIZES = (1, 8, 64, 256)
MAX_WARMUP_RECORDS = 1000  # TensorFlow Serving refuses to load a version with more
_NO_SERVING_API = (
    "Writing TensorFlow Serving warm-up requests needs the package tensorflow-serving-api "
    "(pip install tensorflow-serving-api)."
)

logger = logging.getLogger(__name__)


def warmup_path(export_dir):
    """Where TensorFlow Serving looks for the warm-up requests of the version `export_dir`."""
    return os.path.join(os.fspath(export_dir), WARMUP_DIR, WARMUP_FILENAME)


def warmup_requests(sentences, sizes=DEFAULT_WARMUP_SIZES):
    """The requests: for each size, that many of `sentences` in order, cycling through them.

    Raises:
        ValueError: no sentences, a sentence that is not a `str`, a size
            that is not a positive integer, or more than 1,000 sizes.
    """
    sentences = list(sentences)
    if not sentences:
        raise ValueError("Warm-up requests need at least one sentence.")
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise ValueError(f"Warm-up sentence {index} is a {type(sentence).__name__}, not a str: {sentence!r}.")
    sizes = list(sizes)
    if not sizes or len(sizes) > MAX_WARMUP_RECORDS:
        raise ValueError(
            f"Warm-up requests: 1 to {MAX_WARMUP_RECORDS} sizes (TensorFlow Serving refuses to load a "
            f"version with more than {MAX_WARMUP_RECORDS} records), got {len(sizes)}."
        )
    for size in sizes:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"Warm-up request sizes must be positive integers, got {size!r}.")
    return [[sentences[i % len(sentences)] for i in range(size)] for size in sizes]


def write_warmup_requests(export_dir, sentences, sizes=DEFAULT_WARMUP_SIZES, signature_name=SIGNATURE_NAME):
    """Writes `warmup_requests(sentences, sizes)` for `signature_name` into the version `export_dir`; returns the path.

    Replaces an existing warm-up file: written under another name and renamed
    into place, so a server loading the version never reads half a file (a
    version already loaded reads it when it loads again). Needs
    `tensorflow-serving-api` (its `PredictionLog` protos).
    """
    if not _serving_api_installed():
        raise ImportError(_NO_SERVING_API)
    from tensorflow_serving.apis import model_pb2, predict_pb2, prediction_log_pb2

    requests = warmup_requests(sentences, sizes)
    path = warmup_path(export_dir)
    tf.io.gfile.makedirs(os.path.dirname(path))
    partial = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with tf.io.TFRecordWriter(partial) as writer:
            for request_sentences in requests:
                request = predict_pb2.PredictRequest(model_spec=model_pb2.ModelSpec(signature_name=signature_name))
                encoded = [sentence.encode("utf-8") for sentence in request_sentences]
                request.inputs[INPUT_NAME].CopyFrom(
                    tf.make_tensor_proto(encoded, dtype=tf.string, shape=[len(encoded)])
                )
                log = prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))
                writer.write(log.SerializeToString())
        tf.io.gfile.rename(partial, path, overwrite=True)
    finally:
        if tf.io.gfile.exists(partial):
            tf.io.gfile.remove(partial)
    return path


def read_warmup_requests(export_dir):
    """The warm-up requests of the version `export_dir`: `[(signature_name, [sentence, ...]), ...]`, or `[]`."""
    path = warmup_path(export_dir)
    if not tf.io.gfile.exists(path):
        return []
    from tensorflow_serving.apis import prediction_log_pb2

    requests = []
    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        request = prediction_log_pb2.PredictionLog.FromString(record).predict_log.request
        sentences = [s.decode("utf-8") for s in tf.make_ndarray(request.inputs[INPUT_NAME]).tolist()]
        requests.append((request.model_spec.signature_name, sentences))
    return requests


def run_validation_sources(run_dir, limit=None):
    """Up to `limit` source sentences of the validation split of the data `run_dir` trained on, or None.

    `limit` defaults to the largest of `DEFAULT_WARMUP_SIZES`.

    Read for the vendored Multi30k and for "files:" data whose validation
    files exist (their paths as the run recorded them: relative ones from
    the current directory); None for TensorFlow Datasets (reading it may
    download it), for a run that records no data or trained without a
    validation split, and when the files are missing.

    Raises:
        FileNotFoundError: `run_dir` has no `config.json`.
        ValueError: the recorded data cannot be read (unknown spec, files
            whose line counts differ, invalid UTF-8).
    """
    if limit is None:
        limit = max(DEFAULT_WARMUP_SIZES)
    from keras_transformer.data.spec import DataSpec
    from keras_transformer.run_dir import read_config

    config = read_config(os.fspath(run_dir))
    data = config.get("data") or {}
    split = (config.get("training") or {}).get("validation_split", "val")
    if not {"spec", "src", "tgt"} <= set(data) or split is None:
        return None
    spec = DataSpec.parse(data["spec"])
    src, tgt = data["src"], data["tgt"]
    if spec.kind == "tfds":
        return None
    if spec.kind == "files":
        paths = [p.format(split=spec.split_name(split), src=src, tgt=tgt) for p in spec.paths]
        if not all(os.path.isfile(p) for p in paths):
            return None
    pairs = spec.load(split, src, tgt).take(limit)
    return [source.decode("utf-8") for source, _ in pairs.as_numpy_iterator()]


def sizes_within(max_batch_size, sizes=DEFAULT_WARMUP_SIZES):
    """The warm-up request sizes a model that takes at most `max_batch_size` sentences per request answers.

    TF Serving does not load a version whose warm-up requests fail, so
    larger sizes are left out (and `max_batch_size` itself stands in if none fits).
    """
    return [size for size in sizes if size <= max_batch_size] or [max_batch_size]


def warmup_for_export(warmup_sentences, source):
    """What an export writes as its warm-up requests: a function of the new version's directory and its
    `max_batch_size` (requests larger than that are left out, `sizes_within`), or None.

    `warmup_sentences` as `export_saved_model` takes it: None (none), a list
    of sentences (checked here, before the export's slow part), or "auto",
    which never fails an export: an exported version's own requests when
    `source` is one that has them, else the validation sources of a run
    directory (`run_validation_sources`), else none (logged, with why).
    """
    if warmup_sentences is None:
        return None
    if isinstance(warmup_sentences, str):
        if warmup_sentences != "auto":
            raise ValueError(f"warmup_sentences must be 'auto', None or a list of sentences, got {warmup_sentences!r}.")
        return _auto_warmup(source)
    sentences = list(warmup_sentences)
    warmup_requests(sentences)  # refuses bad sentences now
    if not _serving_api_installed():
        raise ImportError(_NO_SERVING_API)
    return lambda version_dir, max_batch_size: write_warmup_requests(
        version_dir, sentences, sizes_within(max_batch_size)
    )


def _auto_warmup(source):
    """`warmup_for_export("auto", source)`."""
    from keras_transformer.run_dir import CONFIG_FILENAME

    if not isinstance(source, (str, os.PathLike)):
        return _none("a Translator has no run directory to take validation sentences from")
    if tf.io.gfile.exists(warmup_path(source)):
        previous = warmup_path(source)
        # The export's own requests, which its max_batch_size (kept by a re-export) answers.
        return lambda version_dir, max_batch_size: _copy(previous, warmup_path(version_dir))
    if not os.path.isfile(os.path.join(os.fspath(source), CONFIG_FILENAME)):
        return _none(f"{source} is not a run directory, nor an export with warm-up requests")
    try:
        sentences = run_validation_sources(source)
    except (OSError, ValueError, tf.errors.OpError) as error:
        return _none(f"the validation data of {source} could not be read ({error})", logging.WARNING)
    if not sentences:
        return _none(f"no validation data of {source} can be read here")
    if not _serving_api_installed():
        return _none(_NO_SERVING_API, logging.WARNING)
    return lambda version_dir, max_batch_size: write_warmup_requests(
        version_dir, sentences, sizes_within(max_batch_size)
    )


def _none(reason, level=logging.INFO):
    logger.log(
        level,
        "No TensorFlow Serving warm-up requests written: %s. Pass warmup_sentences "
        "(export --warmup-sentences FILE) to add them.",
        reason.rstrip("."),
    )
    return None


def _copy(source_path, target_path):
    """Copies an export's warm-up file to a new version's place for it; returns that path."""
    tf.io.gfile.makedirs(os.path.dirname(target_path))
    tf.io.gfile.copy(source_path, target_path, overwrite=True)
    return target_path


def _serving_api_installed():
    try:
        from tensorflow_serving.apis import prediction_log_pb2  # noqa: F401
    except ImportError:
        return False
    return True
