"""Shared test setup: quiet TensorFlow, deterministic seeds, float32 policy per test."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import shutil  # noqa: E402

import pytest  # noqa: E402

# TensorFlow (keras, keras_transformer) is imported inside the fixtures and helpers: under
# pytest-xdist (`make test`) this file also loads in the controller process, which runs no test.

# A script that tests/test_distributed.py runs in subprocesses: not a test module, and
# `--doctest-modules` (pytest.ini) must not import it.
collect_ignore = ["distributed_worker.py"]

TINY_RUN_VOCAB = 400
TINY_RUN_MAX_LENGTH = 32
# The smallest network the training tests train: one layer each side, d_model 32, no dropout (deterministic).
TINY_NET = {"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64}


def new_run_dir(path, spm_model):
    """A run directory holding a copy of `spm_model`, so training reuses that vocabulary."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(spm_model, path / "spm.model")
    return path


def read_csv(path):
    """The rows of a CSV log of a run directory (history.csv, steps.csv, ...) as dicts; it must exist."""
    from keras_transformer import run_dir as run_layout

    assert os.path.exists(path), f"no {path}"
    return run_layout.read_csv(path)


@pytest.fixture(scope="session")
def spm500(tmp_path_factory):
    """A 500-piece vocabulary of Multi30k train (copied into run directories to skip training it)."""
    from keras_transformer.data import corpora
    from keras_transformer.data.tokenizer import train_tokenizer

    prefix = tmp_path_factory.mktemp("spm") / "spm"
    train_tokenizer(corpora.read_lines("train", "en") + corpora.read_lines("train", "de"), prefix, 500)
    return str(prefix) + ".model"


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    import keras

    keras.utils.set_random_seed(1234)
    keras.mixed_precision.set_global_policy("float32")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="session")
def tiny_run_dir(tmp_path_factory):
    """A run directory as `keras_transformer.training` lays it out (config.json, spm.model,
    model.keras): a SentencePiece vocabulary of 400 trained on 2000 Multi30k pairs and an
    untrained tiny Transformer with max_length 32. Cheap stand-in for a training run."""
    import keras

    from keras_transformer import Transformer, TransformerConfig
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.data.tokenizer import train_tokenizer

    keras.utils.set_random_seed(0)
    path = tmp_path_factory.mktemp("run")
    texts = read_lines("train", "en")[:2000] + read_lines("train", "de")[:2000]
    train_tokenizer(texts, path / "spm", vocab_size=TINY_RUN_VOCAB)
    config = TransformerConfig.tiny(TINY_RUN_VOCAB, max_length=TINY_RUN_MAX_LENGTH)
    model = Transformer(config)
    model.compile()
    model.save(path / "model.keras")
    (path / "config.json").write_text(
        json.dumps({"model": config.to_dict(), "tokenizer": "spm.model", "final_model": "model.keras"}, indent=2)
    )
    return str(path)


@pytest.fixture(scope="session")
def end_token_run_dir(tiny_run_dir, tmp_path_factory):
    """The tiny run with hypotheses of different lengths competing, so that decoding options change results.

    Its shared embedding is shrunk (every other token nearly equally likely, so near-ties everywhere) and
    the end token's row is a fixed random direction of norm 6, so a hypothesis ends at context-dependent
    steps: the length penalty, the stopping rule and bfloat16 rounding then change which hypothesis wins,
    where an untrained model would run every hypothesis to the length limit.
    """
    import numpy as np

    from keras_transformer.run_dir import load_run
    from keras_transformer.special_ids import EOS_ID

    path = tmp_path_factory.mktemp("end_token") / "run"
    shutil.copytree(tiny_run_dir, path)
    model, _ = load_run(str(path))
    embeddings = model.output_projection.embeddings
    weights = embeddings.numpy() * 0.05
    direction = np.random.default_rng(0).normal(size=weights.shape[1])
    weights[EOS_ID] = 6.0 * direction / np.linalg.norm(direction)
    embeddings.assign(weights)
    model.save(path / "model.keras")
    return str(path)


@pytest.fixture(scope="session")
def upper_saved_model(tmp_path_factory):
    """A SavedModel whose `serving_default` "translates" each sentence by upper-casing it.

    A stand-in for an export in the serving benchmarks' tests: strings in, `translations` out, at no cost.
    """
    import tensorflow as tf

    class Upper(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
        def serve(self, inputs):
            return {"translations": tf.strings.upper(inputs)}

    path = str(tmp_path_factory.mktemp("upper") / "1")
    module = Upper()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    return path
