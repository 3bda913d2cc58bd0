"""The example scripts run and do what they say."""

import ast
import importlib.util
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parent.parent / "examples"


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reuse_layers_example_trains_both_classifiers(tmp_path):
    example = load_example("reuse_layers")
    results = example.main(["--epochs", "4", "--examples", "2048"])
    # Chance is 0.5; both models must have learned the task.
    assert results["encoder_classifier"] > 0.85, results
    assert results["gelu_classifier"] > 0.85, results
    # The subclassed model round-trips through .keras.
    model = example.gelu_classifier()
    x, _ = example.make_data(np.random.default_rng(1), 8)
    path = tmp_path / "gelu.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    assert any(isinstance(layer, example.GeluEncoderLayer) for layer in restored.layers)
    np.testing.assert_allclose(restored(x), model(x), atol=1e-6)


# The example scripts that train, and the name each begins its error line with.
TRAINING_SCRIPTS = ["train_multi30k", "train_wmt14", "reproduce_multi30k", "long_multi30k"]

# Runs an example as `python examples/NAME.py ARGS` does, with a training that SIGTERM stops at its first step.
STOPPED_AT_STEP_5 = """
import runpy, signal, sys
from keras_transformer import training
from keras_transformer.training.callbacks import TrainingInterrupted

def stopped(*args, **kwargs):
    raise TrainingInterrupted(signal.SIGTERM, 5)

training.train = stopped
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("name", ["train_multi30k", "train_wmt14"])
def test_a_training_example_stopped_by_a_signal_ends_in_one_line_with_its_status(tmp_path, name):
    """As `keras-transformer train`: 128 + SIGTERM's number, how to go on, and no traceback."""
    script = EXAMPLES / f"{name}.py"
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", STOPPED_AT_STEP_5, str(script), "--output", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 143, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    line = f"{name}.py: interrupted (SIGTERM at step 5); run the same command again to resume from its checkpoint."
    assert done.stderr.splitlines()[-1] == line


@pytest.mark.parametrize("name", TRAINING_SCRIPTS)
def test_every_training_example_ends_through_run_script(name):
    """The recipes' scripts (whose data preparation is too slow to stop here) end as the two above."""
    tree = ast.parse((EXAMPLES / f"{name}.py").read_text(encoding="utf-8"))
    main_block = next(node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test))
    calls = [node for node in ast.walk(main_block) if isinstance(node, ast.Call)]
    run = [call for call in calls if ast.unparse(call.func) == "run_script"]
    assert len(run) == 1 and ast.literal_eval(run[0].args[1]) == f"{name}.py"
