"""The served signature is strict: what is not a batch of sentences gets a clear error, through the
loaders that stand in for TensorFlow Serving (tf.saved_model.load and a tf.compat.v1 Session)."""

import json
import os
import subprocess
import sys

import pytest

from keras_transformer.inference.saved_model import export_saved_model
from keras_transformer.inference.translator import Translator

_PROBE = r"""
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
import numpy as np
import tensorflow as tf
import tensorflow_text  # noqa: F401  (the SentencePiece ops)

export_dir, too_many = sys.argv[1], int(sys.argv[2])
CASES = {
    "matrix": lambda: [["a dog", "a cat"]],
    "scalar": lambda: "a dog",
    "numbers": lambda: [1, 2],
    "too_many": lambda: ["a dog"] * too_many,
    "fine": lambda: ["a dog", ""],
}
answers = {}
serve = tf.saved_model.load(export_dir).signatures["serving_default"]
for name, make in CASES.items():
    value = make()
    try:
        tensor = tf.constant(value, tf.int32) if name == "numbers" else tf.constant(value, tf.string)
        out = serve(inputs=tensor)
        answers["eager_" + name] = "ok " + str(out["translations"].shape.as_list())
    except Exception as error:  # the type and message are what the test looks at
        answers["eager_" + name] = type(error).__name__ + ": " + str(error)[:600]
with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], export_dir)
    signature = meta_graph.signature_def["serving_default"]
    fetch = signature.outputs["translations"].name
    for name, make in CASES.items():
        value = make()
        feed = np.array(value, dtype=np.int32 if name == "numbers" else object)
        try:
            out = session.run(fetch, {signature.inputs["inputs"].name: feed})
            answers["session_" + name] = "ok " + str(list(out.shape))
        except Exception as error:
            answers["session_" + name] = type(error).__name__ + ": " + str(error)[:600]
print(json.dumps(answers))
"""


@pytest.fixture(scope="module")
def answers(tiny_run_dir, tmp_path_factory):
    translator = Translator.from_run_dir(tiny_run_dir, beam_size=2, max_extra_length=4, max_batch_size=8)
    path = export_saved_model(translator, str(tmp_path_factory.mktemp("strict") / "model"))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, path, "9"], capture_output=True, text=True, env=env, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("loader", ["eager", "session"])
def test_a_batch_of_sentences_is_answered(answers, loader):
    assert answers[f"{loader}_fine"] == "ok [2]"


@pytest.mark.parametrize("loader", ["eager", "session"])
def test_too_many_sentences_get_an_error_naming_the_limit(answers, loader):
    answer = answers[f"{loader}_too_many"]
    assert answer.startswith("InvalidArgumentError") and "at most 8 sentences per request" in answer, answer


@pytest.mark.parametrize("loader", ["eager", "session"])
@pytest.mark.parametrize("case", ["matrix", "scalar", "numbers"])
def test_what_is_not_a_vector_of_strings_is_refused_before_the_graph(answers, loader, case):
    answer = answers[f"{loader}_{case}"]
    assert not answer.startswith("ok"), answer
    if case == "numbers":
        # The request's conversion to the signature's tf.string refuses it: the graph never runs.
        assert "int" in answer and "node" not in answer, answer
    else:
        # The graph's first check, by name, or the loader's own shape check: not an op deep in the search.
        assert "inputs_must_be_a_vector_of_sentences" in answer or "Cannot feed value of shape" in answer, answer
    assert "while" not in answer and "Sentencepiece" not in answer and "Ragged" not in answer, answer


def test_translate_refuses_a_batch_size_over_the_limit(tiny_run_dir):
    translator = Translator.from_run_dir(tiny_run_dir, max_batch_size=8)
    with pytest.raises(ValueError, match="batch_size must be between 1 and 8"):
        translator.translate(["a dog"], batch_size=9)
