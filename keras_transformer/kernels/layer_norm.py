"""Kernel forms of layer normalization (Ba et al., 2016; Vaswani et al., 2017, §3.1).

The plain form, `LayerNormalization.call` with `standardize` in
`keras_transformer.layers.layer_norm`, is

    x_hat = (x - mean) / sqrt(variance + epsilon),    y = gamma * x_hat + beta

over the features of each position. Two forms here compute the same:

- `standardize`: x_hat with a closed-form gradient,

      dx = (g - mean(g) - x_hat * mean(g * x_hat)) / sqrt(variance + epsilon)

  one expression instead of the many small ops autodiff builds through the
  mean and the variance (it trains: equal in value and gradient).
- `fused_layer_norm`: y written as the pattern TensorFlow's oneDNN rewrite
  fuses into one `_MklLayerNorm` kernel, for inference in a TensorFlow graph
  (`fused_layer_norm_runs` says when). Statistics in float32 whatever the dtype.

`tests/test_kernels.py` checks both against the plain form.
"""

import keras
from keras import ops

from keras_transformer import compat


def standardize(x, epsilon):
    """`(x - mean) / sqrt(variance + epsilon)` over the last axis, with the closed-form gradient.

    Args:
        x: `[..., D]`, in the dtype the statistics are computed in.
        epsilon: added to the variance.

    Returns:
        x_hat, of `x`'s shape and dtype: the plain `standardize`'s values.
    """

    @ops.custom_gradient
    def normalize(x):
        centered = x - ops.mean(x, axis=-1, keepdims=True)
        inverse_std = ops.rsqrt(ops.mean(ops.square(centered), axis=-1, keepdims=True) + epsilon)
        normalized = centered * inverse_std

        def grad(*args, upstream=None):
            if upstream is None:  # TensorFlow passes the upstream gradient positionally
                (upstream,) = args
            projection = ops.mean(upstream * normalized, axis=-1, keepdims=True)
            return inverse_std * (upstream - ops.mean(upstream, axis=-1, keepdims=True) - normalized * projection)

        return normalized, grad

    return normalize(x)


def fused_layer_norm_runs(dtype, training):
    """Whether `fused_layer_norm` applies and becomes oneDNN's layer-norm kernel.

    At inference (`training` falsy), in a TensorFlow graph that XLA does not
    compile, with oneDNN's kernels on, for float32 or bfloat16, where no
    gradient is recorded.
    """
    if training or keras.backend.backend() != "tensorflow":
        return False
    if keras.backend.standardize_dtype(dtype) not in ("float32", "bfloat16"):
        return False
    import tensorflow as tf

    return (
        tf.inside_function()
        and not compat.graph_is_compiled_by_xla()
        and compat.onednn_kernels_enabled()
        and not compat.gradient_may_be_recorded()
    )


def fused_layer_norm(inputs, epsilon, gamma, beta):
    """The layer norm of `inputs [..., D]` as the pattern TensorFlow's oneDNN remapper fuses (`_MklLayerNorm`).

    The rows are the channels of a `[1, rows, D, 1]` NCHW batch norm in
    training mode (so it normalizes each row by its own statistics), then
    gamma and beta. Equal to the plain form up to rounding (within a
    bfloat16 rounding in bfloat16). TensorFlow only.

    Args:
        inputs: `[..., D]` float32 or bfloat16.
        epsilon: added to the variance.
        gamma, beta: `[D]` scale and shift.

    Returns:
        `gamma * x_hat + beta`, of `inputs`' shape and dtype.
    """
    import tensorflow as tf

    shape = tf.shape(inputs)
    rows = tf.reduce_prod(shape[:-1])
    width = inputs.shape[-1]
    grid = tf.reshape(inputs, [1, rows, width, 1])
    ones, zeros = tf.ones([rows], tf.float32), tf.zeros([rows], tf.float32)
    normalized, _, _ = tf.compat.v1.nn.fused_batch_norm(
        grid, ones, zeros, epsilon=epsilon, data_format="NCHW", is_training=True
    )
    normalized = tf.reshape(normalized, shape)
    return normalized * tf.cast(gamma, inputs.dtype) + tf.cast(beta, inputs.dtype)
