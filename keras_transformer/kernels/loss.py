"""The label-smoothed cross-entropy of §5.4 and its argmax, as XLA and TensorFlow kernels.

`keras_transformer.losses` writes the loss of one token with logits `z` and
label `y` the way the paper and Szegedy et al. (2016) define it,

    logsumexp(z) - (1 - epsilon) z_y - (epsilon / V) sum_k z_k,

with the closed-form gradient `softmax(z) - q`. The logits `[B, T, V]` are
the largest tensor of a training step, and TensorFlow's op-by-op kernels
read them several times for that formula. The forms here read them once:

- `xla_compiled(function)`: a per-token loss function compiled by XLA into
  a few fused loops (the float32 cast of bfloat16 logits fused in as well).
- `weighted_loss_with_gradient`: the weighted sum of the token losses whose
  gradient is computed in the same XLA-compiled pass as its value, where
  `softmax(z)` is at hand for the log-normalizer; the backward pass only
  scales it.
- `argmax`: TensorFlow's own argmax, for the accuracy metric, without the
  extra passes that `keras.ops.argmax` makes over the logits.

`tests/test_kernels_loss.py` checks that each equals the plain form in value
and gradient. Measurements are in `benchmarks/README.md`. TensorFlow is
imported inside the functions: the model side imports `losses`, and through
it this module, without needing TensorFlow's pipeline.
"""

import functools

from keras import ops


@functools.cache
def xla_compiled(function):
    """`function` as a `tf.function` compiled by XLA (`jit_compile=True`), built once per function.

    XLA compiles again for each new input shape; bucketed batches have a few
    dozen.

    Args:
        function: a function of tensors, e.g. the per-token loss of
            `keras_transformer.losses`.

    Returns:
        The compiled `tf.function`, with `function`'s gradient.
    """
    import tensorflow as tf

    return tf.function(function, jit_compile=True)


def _weighted_loss_and_gradient(logits, labels, weights, epsilon, gradient_dtype):
    """`sum_t weights_t loss_t` (float32) and its gradient `weights_t (softmax(z_t) - q_t)`, in one pass.

    The forward pass needs `exp(z - max)` for the log-normalizer anyway; the
    gradient reuses it there instead of reading the logits again later.
    """
    z = ops.cast(logits, "float32")
    largest = ops.max(z, axis=-1, keepdims=True)
    shifted = ops.exp(z - largest)
    total = ops.sum(shifted, axis=-1, keepdims=True)
    log_normalizer = ops.squeeze(ops.log(total) + largest, -1)
    target_logit = ops.squeeze(ops.take_along_axis(z, labels[..., None], axis=-1), axis=-1)
    token_losses = log_normalizer - (1.0 - epsilon) * target_logit - epsilon * ops.mean(z, axis=-1)
    target = (1.0 - epsilon) * ops.one_hot(labels, z.shape[-1], dtype="float32") + epsilon / z.shape[-1]
    # `where`: a padded position's loss and gradient are 0 even when its logits are not finite.
    counted = weights != 0
    gradient = ops.where(counted[..., None], weights[..., None] * (shifted / total - target), 0.0)
    value = ops.sum(ops.where(counted, token_losses * weights, 0.0))
    return value, ops.cast(gradient, gradient_dtype)


def weighted_loss_with_gradient(logits, labels, weights, epsilon):
    """`sum_t weights_t loss_t` whose backward pass returns the gradient computed with it (TensorFlow only).

    The value and the gradient come out of one XLA-compiled pass over the
    logits. The backward pass only scales the stored gradient by the
    upstream gradient, and skips even that when it is 1 (a plain `fit`).
    float16 gradients are kept in float32 until then: unscaled, they would
    underflow before a loss scale could lift them. A bfloat16 gradient is
    stored in bfloat16, so an upstream gradient other than a power of two
    rounds it twice. `weights` get no gradient.

    Args:
        logits: `[..., V]`, any float dtype.
        labels: int32 `[...]`.
        weights: float32 `[...]`, 0 where a token does not count.
        epsilon: the label smoothing epsilon_ls.

    Returns:
        The float32 scalar sum, differentiable with respect to `logits`.
    """
    import tensorflow as tf

    gradient_dtype = tf.float32 if logits.dtype == tf.float16 else logits.dtype

    @tf.custom_gradient
    def weighted_loss(logits):
        # stop_gradient: in eager mode the tape would otherwise record the compiled call itself and
        # make it keep the intermediates of a backward pass that the custom gradient replaces.
        value, gradient = xla_compiled(_weighted_loss_and_gradient)(
            tf.stop_gradient(logits), labels, weights, epsilon, gradient_dtype
        )

        def grad(upstream):
            return tf.cond(
                tf.equal(upstream, 1.0),
                lambda: tf.cast(gradient, logits.dtype),
                lambda: tf.cast(tf.cast(gradient, tf.float32) * upstream, logits.dtype),
            )

        return value, grad

    return weighted_loss(logits)


def argmax(logits):
    """int32 index of the largest logit over the last axis (the first of ties), by `tf.argmax` (TensorFlow only).

    `keras.ops.argmax` on TensorFlow first rewrites -0.0 (a flush-to-zero
    workaround) in several more passes over the logits; logits of -0.0 and
    0.0 compare equal either way, so the index is the same.

    Args:
        logits: `[..., V]`.

    Returns:
        int32 `[...]`.

    Example:
    >>> argmax(ops.array([[0.0, 2.0, 2.0], [-0.0, 0.0, -1.0]])).numpy().tolist()
    [1, 0]
    """
    import tensorflow as tf

    return tf.argmax(logits, axis=-1, output_type=tf.int32)
