"""Layer normalization (Ba et al., 2016; Vaswani et al., 2017, §3.1).

Every sublayer's output goes through `LayerNorm(x + Sublayer(x))` (§3.1).
Each position's features are standardized to mean 0 and variance 1, then
scaled and shifted by learned `gamma` and `beta`:

    x_hat = (x - mean) / sqrt(variance + epsilon)
    y     = x_hat * gamma + beta

`LayerNormalization.call` computes that; its kernel forms (a closed-form
gradient, and oneDNN's fused kernel at inference) are in
`keras_transformer.kernels.layer_norm`.
"""

import keras
from keras import ops

from keras_transformer.kernels import layer_norm as kernels


def standardize(x, epsilon):
    """x_hat: each position's features to mean 0 and variance 1, over the last axis.

    Args:
        x: `[..., D]`.
        epsilon: added to the variance, so that a constant row stays finite.

    Returns:
        `(x - mean) / sqrt(variance + epsilon)`, of `x`'s shape and dtype.

    Example:
    >>> [round(float(v), 4) for v in standardize(ops.array([[1.0, 3.0]]), 1e-6)[0]]
    [-1.0, 1.0]
    """
    mean = ops.mean(x, axis=-1, keepdims=True)
    variance = ops.mean(ops.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * ops.rsqrt(variance + epsilon)


@keras.saving.register_keras_serializable(package="keras_transformer")
class LayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis, statistics in float32 at least (§3.1).

    Same weights (`gamma`, `beta`) and config as the Keras layer, and the
    same results up to float rounding, so checkpoints move freely between
    the two. Normalizing over the last axis with both a scale and a shift,
    the case of every Transformer layer, it computes `standardize(x) *
    gamma + beta` in at least float32 whatever the dtype policy (bfloat16
    statistics lose small variances), x_hat with a closed-form gradient
    (`kernels.layer_norm.standardize`); any other configuration is the Keras
    computation.

    Args:
        epsilon: added to the variance; 1e-6 in the Transformer's layers.
        **kwargs: the other `keras.layers.LayerNormalization` arguments.

    Call arguments:
        inputs: `[..., D]`.
        training: falsy at inference; then, in a TensorFlow graph with
            oneDNN's kernels and no gradient recorded, one fused kernel
            computes it (`kernels.layer_norm.fused_layer_norm`), with the
            same results up to rounding.

    Returns:
        `[..., D]` in the compute dtype.

    Example:
    >>> layer = LayerNormalization(epsilon=1e-6)
    >>> y = layer(ops.array([[1.0, 3.0], [-4.0, 4.0]]))  # each row to mean 0, variance 1; gamma 1, beta 0
    >>> [[round(float(v), 4) for v in row] for row in y]
    [[-1.0, 1.0], [-1.0, 1.0]]
    """

    def build(self, input_shape):
        super().build(input_shape)  # makes self.axis a sorted list
        self._closed_form = (
            self.axis in ([-1], [len(input_shape) - 1]) and self.scale and self.center and not self.rms_scaling
        )

    def call(self, inputs, training=None):
        if not self._closed_form:
            return super().call(inputs)
        if kernels.fused_layer_norm_runs(inputs.dtype, training):
            return kernels.fused_layer_norm(inputs, self.epsilon, self.gamma, self.beta)
        dtype = keras.backend.result_type(inputs.dtype, "float32")
        x = ops.cast(inputs, dtype)
        x_hat = kernels.standardize(x, self.epsilon)  # `standardize(x, epsilon)`, with a closed-form gradient
        outputs = x_hat * ops.cast(self.gamma, dtype) + ops.cast(self.beta, dtype)
        return ops.cast(outputs, self.compute_dtype)
