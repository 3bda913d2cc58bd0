"""R-Drop's symmetric KL divergence as one XLA kernel for its value and gradient.

`keras_transformer.training.rdrop` writes the divergence of the two passes'
token distributions p1 = softmax(z1) and p2 = softmax(z2) as

    s = 1/2 sum_k (p1(k) - p2(k)) (log p1(k) - log p2(k)).

Written with TensorFlow's op-by-op kernels, the value and its automatic
gradient pass over the two passes' float32 logits `[B, T, V]` some thirty
times, more than the rest of the loss. With d = log p1 - log p2, the
gradient has the closed form

    ds/dz1 = 1/2 (p1 (d - KL(p1 || p2)) + p1 - p2)
    ds/dz2 = 1/2 (p2 (-d - KL(p2 || p1)) + p2 - p1)

(KL(p1 || p2) = sum_k p1(k) d(k), KL(p2 || p1) = -sum_k p2(k) d(k)), so one
XLA-compiled pass computes the value and the gradient together, and the
backward pass only scales the stored gradient.

`tests/test_rdrop.py` checks that it equals the plain form in value and
gradient. Measurements are in `benchmarks/README.md`. TensorFlow is
imported inside the function, as in `kernels.loss`.
"""

from keras import ops

from keras_transformer.kernels.loss import xla_compiled


def _weighted_divergence_and_gradient(logits, weights, gradient_dtype):
    """`sum_t weights_t s_t` (float32) over the first pass's positions and its gradient `[2B, T, V]`, in one pass.

    `where`: a position of weight 0 (padding) adds 0 and gets a zero
    gradient, even where its logits are not finite.
    """
    z1, z2 = ops.split(ops.cast(logits, "float32"), 2, axis=0)
    log_p1 = z1 - ops.logsumexp(z1, axis=-1, keepdims=True)
    log_p2 = z2 - ops.logsumexp(z2, axis=-1, keepdims=True)
    p1, p2 = ops.exp(log_p1), ops.exp(log_p2)
    d = log_p1 - log_p2
    kl_12 = ops.sum(p1 * d, axis=-1, keepdims=True)
    kl_21 = -ops.sum(p2 * d, axis=-1, keepdims=True)
    counted = weights != 0
    value = ops.sum(ops.where(counted, weights * 0.5 * ops.squeeze(kl_12 + kl_21, -1), 0.0))
    scale = (0.5 * weights)[..., None]
    gradient_1 = ops.where(scale != 0, scale * (p1 * (d - kl_12) + p1 - p2), 0.0)
    gradient_2 = ops.where(scale != 0, scale * (p2 * (-d - kl_21) + p2 - p1), 0.0)
    return value, ops.cast(ops.concatenate([gradient_1, gradient_2], axis=0), gradient_dtype)


def weighted_divergence_with_gradient(logits, weights):
    """`sum_t weights_t s_t` whose backward pass returns the gradient computed with it (TensorFlow only).

    As `kernels.loss.weighted_loss_with_gradient`: float16 gradients stay in
    float32 until scaled by the upstream gradient; `weights` get no gradient.

    Args:
        logits: `[2B, T, V]`, the first pass's B rows then the second's; any
            float dtype.
        weights: float32 `[B, T]`, 0 where a token does not count.

    Returns:
        The float32 scalar sum, differentiable with respect to `logits`.
    """
    import tensorflow as tf

    gradient_dtype = tf.float32 if logits.dtype == tf.float16 else logits.dtype

    @tf.custom_gradient
    def weighted_divergence(logits):
        # stop_gradient: the tape must not record the compiled call, whose backward pass the custom gradient replaces.
        value, gradient = xla_compiled(_weighted_divergence_and_gradient)(
            tf.stop_gradient(logits), weights, gradient_dtype
        )

        def grad(upstream):
            return tf.cast(tf.cast(gradient, tf.float32) * upstream, logits.dtype)

        return value, grad

    return weighted_divergence(logits)
