"""Positional encodings (Vaswani et al., 2017, §3.5).

    PE(pos, 2i)   = sin(pos / 10000^(2i / d_model))
    PE(pos, 2i+1) = cos(pos / 10000^(2i / d_model))

The sinusoids are computed for the positions actually present, so any length
works. The learned alternative is the one the paper compared in Table 3,
row (E) ("nearly identical results").
"""

import math

import keras
from keras import ops

from keras_transformer import compat
from keras_transformer.layers.initialization import initializer_for_weight


def sinusoidal_encoding(positions, d_model, dtype="float32"):
    """The §3.5 table for `positions` (int `[T]`): `[T, d_model]`, sin at even, cos at odd columns."""
    half = (d_model + 1) // 2
    # 1 / 10000^(2i / d_model) for i = 0 .. half-1
    inverse_frequency = ops.exp(ops.arange(half, dtype="float32") * (-2.0 * math.log(10000.0) / d_model))
    angles = ops.cast(positions, "float32")[:, None] * inverse_frequency[None, :]
    # Interleave: column 2i is sin, column 2i+1 is cos, exactly as in the paper.
    table = ops.reshape(ops.stack([ops.sin(angles), ops.cos(angles)], axis=-1), (-1, 2 * half))
    return ops.cast(table[:, :d_model], dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionalEncoding(keras.layers.Layer):
    """Adds the sinusoidal positional encoding of §3.5 to its input.

    Args:
        none besides the usual layer arguments; `d_model` is read from the input.

    Call arguments:
        inputs: `[B, T, d_model]` embeddings.
        start_index: position of the first step (int, possibly a tensor);
            incremental decoding passes the current step.
        positions: int `[T]`, each step's own position, instead of
            `start_index` (beam search feeds the K hypotheses of one step
            side by side, all at the same position).

    Returns:
        `inputs + PE[start_index : start_index + T]` (or `inputs + PE[positions]`).

    Example:
    >>> pe = PositionalEncoding()(ops.zeros((1, 3, 4)))[0]  # rows are PE(0), PE(1), PE(2)
    >>> ops.convert_to_numpy(pe).round(4)  # columns: sin(pos), cos(pos), sin(pos/100), cos(pos/100)
    array([[ 0.    ,  1.    ,  0.    ,  1.    ],
           [ 0.8415,  0.5403,  0.01  ,  1.    ],
           [ 0.9093, -0.4161,  0.02  ,  0.9998]], dtype=float32)
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def call(self, inputs, start_index=0, positions=None):
        if positions is None:
            positions = ops.arange(ops.shape(inputs)[1]) + start_index
        table = sinusoidal_encoding(positions, inputs.shape[-1], self.compute_dtype)
        return inputs + table[None, :, :]

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionalEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position (Table 3, row E).

    Args:
        max_length: number of positions the table covers; longer inputs are an
            error (a ValueError when the length is known, TensorFlow's gather
            error as the graph runs, NaN outputs under XLA, which cannot raise).
        initializer: initializer of the table.

    Call arguments:
        inputs: `[B, T, d_model]` embeddings.
        start_index: position of the first step.
        positions: int `[T]`, each step's own position (see `PositionalEncoding`).
    """

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if max_length <= 0:
            raise ValueError(f"{self.name}: max_length must be positive, got {max_length}.")
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)
        # Positions are added in place: a Keras mask on the inputs passes through, as in `PositionalEncoding`.
        self.supports_masking = True

    def build(self, input_shape):
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_length, input_shape[-1]),
            # A copy: an instance passed to several layers gives each its own table.
            initializer=initializer_for_weight(self.initializer),
        )
        self.built = True

    def call(self, inputs, start_index=0, positions=None):
        length = inputs.shape[1]
        if isinstance(length, int) and isinstance(start_index, int) and start_index + length > self.max_length:
            raise ValueError(
                f"{self.name}: sequence of {start_index + length} positions is longer than "
                f"max_length={self.max_length} of the learned position table."
            )
        if positions is None:
            positions = ops.arange(ops.shape(inputs)[1]) + start_index
        outputs = inputs + ops.take(self.position_embeddings, positions, axis=0)[None, :, :]
        if compat.runs_with_xla_semantics():
            # XLA clamps an out-of-range gather to the table's last row and cannot raise: NaN makes it visible.
            outside = ops.any(ops.logical_or(positions < 0, positions >= self.max_length))
            outputs = outputs + ops.cast(ops.where(outside, float("nan"), 0.0), outputs.dtype)
        return outputs

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_length": self.max_length, "initializer": keras.initializers.serialize(self.initializer)})
        return config
