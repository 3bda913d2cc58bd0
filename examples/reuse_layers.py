"""Using keras-transformer's layers in another Keras project.

Two small models on a synthetic task, trained with `model.fit`:

1. a sentence classifier built on `Encoder` (embedding + sinusoidal positions
   + encoder stack + masked mean pooling);
2. the same classifier with a subclassed `EncoderLayer` whose feed-forward
   network uses GELU instead of the paper's ReLU.

The task: does the token 7 occur in the sequence? A bag-of-words question
that needs attention over the whole, padded sequence.

Run: python examples/reuse_layers.py [--epochs 3]
"""

import argparse

import keras
import numpy as np
from keras import ops

from keras_transformer.layers import Encoder, EncoderLayer, FeedForward, PositionalEncoding

VOCAB, LENGTH, D_MODEL = 32, 16, 32


@keras.saving.register_keras_serializable(package="examples")
class GeluEncoderLayer(EncoderLayer):
    """An encoder layer whose feed-forward network uses GELU (§3.3 uses ReLU)."""

    def make_feed_forward(self):
        return FeedForward(self.d_ff, activation="gelu", dtype=self.dtype_policy, name="feed_forward")


@keras.saving.register_keras_serializable(package="examples")
class MaskedMeanPooling(keras.layers.Layer):
    """Mean over the real (unmasked) positions."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def compute_mask(self, inputs, mask=None):
        return None

    def call(self, inputs, mask=None):
        if mask is None:
            return ops.mean(inputs, axis=1)
        weights = ops.cast(mask, inputs.dtype)[:, :, None]
        return ops.sum(inputs * weights, axis=1) / ops.maximum(ops.sum(weights, axis=1), 1.0)


def embed(token_ids):
    x = keras.layers.Embedding(VOCAB, D_MODEL, mask_zero=True)(token_ids)
    return PositionalEncoding()(x)


def encoder_classifier():
    """Embedding -> positions -> Encoder (2 layers) -> masked mean -> sigmoid."""
    token_ids = keras.Input((None,), dtype="int32")
    x = Encoder(num_layers=2, num_heads=4, d_ff=64, dropout=0.1)(embed(token_ids))
    x = MaskedMeanPooling()(x)
    return keras.Model(token_ids, keras.layers.Dense(1, activation="sigmoid")(x), name="encoder_classifier")


def gelu_classifier():
    """The same with two subclassed GELU encoder layers stacked by hand."""
    token_ids = keras.Input((None,), dtype="int32")
    x = embed(token_ids)
    for _ in range(2):
        x = GeluEncoderLayer(num_heads=4, d_ff=64, dropout=0.1)(x)
    x = MaskedMeanPooling()(x)
    return keras.Model(token_ids, keras.layers.Dense(1, activation="sigmoid")(x), name="gelu_classifier")


def make_data(rng, count):
    lengths = rng.integers(4, LENGTH + 1, size=count)
    ids = rng.integers(1, VOCAB, size=(count, LENGTH))
    ids[ids == 7] = 8
    labels = rng.random(count) < 0.5
    for row, (length, label) in enumerate(zip(lengths, labels)):
        ids[row, length:] = 0
        if label:
            ids[row, rng.integers(0, length)] = 7
    return ids.astype("int32"), labels.astype("float32")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--examples", type=int, default=4096)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    keras.utils.set_random_seed(0)
    x, y = make_data(rng, args.examples)
    x_test, y_test = make_data(rng, 512)
    results = {}
    for build in (encoder_classifier, gelu_classifier):
        model = build()
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="binary_crossentropy", metrics=["accuracy"])
        model.fit(x, y, batch_size=64, epochs=args.epochs, verbose=2)
        _, accuracy = model.evaluate(x_test, y_test, verbose=0)
        results[model.name] = accuracy
        print(f"{model.name}: test accuracy {accuracy:.3f}")
    return results


if __name__ == "__main__":
    main()
