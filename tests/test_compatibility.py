"""Files written by earlier releases still load and compute what they computed then."""

import pathlib

import keras
import numpy as np

DATA = pathlib.Path(__file__).resolve().parent / "data"


def test_a_keras_file_written_by_0_2_0_loads_with_the_same_logits():
    """tests/data/transformer-0.2.0.keras: a tiny Transformer saved by keras-transformer 0.2.0, with its logits."""
    import keras_transformer  # noqa: F401  (registers the serializable classes)

    expected = np.load(DATA / "transformer-0.2.0.npz")
    model = keras.saving.load_model(DATA / "transformer-0.2.0.keras")
    logits = np.asarray(model((expected["source"], expected["target"]), training=False))
    np.testing.assert_allclose(logits, expected["logits"], rtol=1e-5, atol=1e-5)
