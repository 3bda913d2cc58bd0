"""The example scripts run and do what they say."""

import importlib.util
import pathlib

import keras
import numpy as np

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
