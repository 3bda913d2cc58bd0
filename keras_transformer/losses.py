"""Label-smoothed cross-entropy and token accuracy that ignore padding (Vaswani et al., 2017, §5.4).

"During training, we employed label smoothing of value epsilon_ls = 0.1. This
hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU score." The smoothed target of Szegedy et al. (2016), the
paper's reference [36], is

    q(k) = (1 - epsilon) * [k = y] + epsilon / V

so the loss of one token with logits z is

    -sum_k q(k) log p(k) = logsumexp(z) - (1 - epsilon) z_y - (epsilon / V) sum_k z_k

with the closed-form gradient softmax(z) - q: no scatter, no one-hot in the
forward pass. Under a gradient tape, the mean loss of a batch computes that
gradient in its forward pass, where softmax(z) is at hand for the
log-normalizer.
"""

import functools

import keras
from keras import ops

from keras_transformer import compat
from keras_transformer.special_ids import PAD_ID


def _token_losses(z, log_normalizer, labels, epsilon):
    """`logsumexp(z) - (1 - epsilon) z_y - (epsilon / V) sum_k z_k` per token, from float32 `z [..., V]`."""
    target_logit = ops.squeeze(ops.take_along_axis(z, labels[..., None], axis=-1), axis=-1)
    return log_normalizer - (1.0 - epsilon) * target_logit - epsilon * ops.mean(z, axis=-1)


def _smoothed_target(labels, vocab_size, epsilon):
    """q of each token, `[..., V]` float32: `(1 - epsilon) [k = y] + epsilon / V`."""
    return (1.0 - epsilon) * ops.one_hot(labels, vocab_size, dtype="float32") + epsilon / vocab_size


def _smoothed_token_loss(logits, labels, epsilon):
    """Per-token float32 loss `[...]` of `logits [..., V]` (any float dtype) and int `labels [...]`."""
    if keras.backend.backend() == "tensorflow":
        return _smoothed_token_loss_tf(logits, labels, epsilon)
    return _smoothed_token_loss_generic(logits, labels, epsilon)


def _smoothed_token_loss_generic(logits, labels, epsilon):
    """`keras.ops` version, any backend: float32 loss, closed-form gradient `softmax(z) - q`."""

    @ops.custom_gradient
    def loss_fn(z):
        log_normalizer = ops.logsumexp(z, axis=-1)

        def grad(*args, upstream=None):
            if upstream is None:
                (upstream,) = args
            target = _smoothed_target(labels, z.shape[-1], epsilon)
            upstream = upstream[..., None]
            # `where`: no gradient to tokens with none coming (padding), even from non-finite logits.
            return ops.where(upstream != 0, upstream * (ops.exp(z - log_normalizer[..., None]) - target), 0.0)

        return _token_losses(z, log_normalizer, labels, epsilon), grad

    return loss_fn(ops.cast(logits, "float32"))  # the gradient flows back through the cast


def _smoothed_token_loss_tf(logits, labels, epsilon):
    """The same formula compiled by XLA into a few fused loops over the logits.

    The logits are the largest tensor of a training step (`[B, T, V]`); TF's
    op-by-op kernels (and its fused `SparseSoftmaxCrossEntropyWithLogits`)
    pass over them several times and take ~2x longer forward and backward.
    The float32 cast of bf16 logits is fused in as well. XLA compiles once per
    logits shape; bucketed batches have a few dozen.
    """
    return _xla_compiled_loss()(logits, labels, epsilon)


def _sum_over_replicas(value):
    """Sum of `value` over the replicas of the current `tf.distribute` strategy.

    `value` itself outside a replica context, with one replica, or on another
    backend. TensorFlow is imported here, not with the module: the model side
    imports this module and must not need the pipeline's TensorFlow.
    """
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


@functools.cache
def _xla_compiled_loss():
    import tensorflow as tf

    return tf.function(_smoothed_token_loss_generic, jit_compile=True)


def _weighted_loss_and_gradient(logits, labels, weights, epsilon, gradient_dtype):
    """`sum_t weights_t loss_t` (float32) and its gradient `weights_t (softmax(z_t) - q_t)`, in one pass.

    The forward pass needs `exp(z - max)` for the log-normalizer anyway; the
    gradient reuses it there instead of reading the logits again later.
    """
    z = ops.cast(logits, "float32")
    largest = ops.max(z, axis=-1, keepdims=True)
    shifted = ops.exp(z - largest)
    total = ops.sum(shifted, axis=-1, keepdims=True)
    token_losses = _token_losses(z, ops.squeeze(ops.log(total) + largest, -1), labels, epsilon)
    target = _smoothed_target(labels, z.shape[-1], epsilon)
    # `where`: a padded position's loss and gradient are 0 even when its logits are not finite.
    counted = weights != 0
    gradient = ops.where(counted[..., None], weights[..., None] * (shifted / total - target), 0.0)
    value = ops.sum(ops.where(counted, token_losses * weights, 0.0))
    return value, ops.cast(gradient, gradient_dtype)


@functools.cache
def _xla_compiled_loss_and_gradient():
    import tensorflow as tf

    return tf.function(_weighted_loss_and_gradient, jit_compile=True)


def _weighted_loss_tf(logits, labels, weights, epsilon):
    """`sum_t weights_t loss_t` whose backward pass returns the gradient computed with it.

    The backward pass only scales the stored gradient by the upstream
    gradient, and skips even that when it is 1 (a plain `fit`). float16
    gradients are kept in float32 until then: unscaled, they would underflow
    before a loss scale could lift them. A bf16 gradient is stored in bf16,
    so an upstream gradient other than a power of two rounds it twice.
    `weights` get no gradient.
    """
    import tensorflow as tf

    gradient_dtype = tf.float32 if logits.dtype == tf.float16 else logits.dtype

    @tf.custom_gradient
    def weighted_loss(logits):
        # stop_gradient: in eager mode the tape would otherwise record the compiled call itself and
        # make it keep the intermediates of a backward pass that the custom gradient replaces.
        value, gradient = _xla_compiled_loss_and_gradient()(
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


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Sparse label-smoothed cross-entropy over logits, averaged over real tokens (§5.4).

    Tokens whose label is `pad_id` contribute nothing. The mean is taken over
    the real tokens of the whole global batch, also under a `tf.distribute`
    strategy (each replica divides its sum by the all-reduced token count), so
    one device and N replicas train alike. On TensorFlow, when a gradient
    tape records where the loss is called (eagerly, or while a function is
    traced, as `fit`'s step is), the mean and its gradient come out of one
    XLA-compiled pass over the logits, and the backward pass only scales that
    gradient. Otherwise (`evaluate`'s step; a function traced without a tape
    and differentiated later) the per-token losses of `call()` are summed and
    differentiated the usual way, a second pass over the logits.

    Args:
        label_smoothing: epsilon_ls; 0.1 in the paper.
        pad_id: label id to ignore.
        reduction: only Keras' default, "sum_over_batch_size": the loss is
            always the mean over real tokens; `call()` gives the per-token
            losses.

    Call arguments:
        y_true: int labels `[B, T]`.
        y_pred: logits `[B, T, V]` (computed in float32 whatever their dtype).

    Example:
    >>> loss = LabelSmoothedCrossEntropy(0.1)
    >>> logits = ops.stack([ops.zeros(10), ops.arange(10.0)])[None]  # [1, 2, V = 10]
    >>> float(loss(ops.array([[5, 0]]), logits))  # uniform 1st token: log V; the padded 2nd adds nothing
    2.302585...
    """

    def __init__(self, label_smoothing=0.1, pad_id=PAD_ID, name="label_smoothed_cross_entropy", **kwargs):
        reduction = kwargs.get("reduction", "sum_over_batch_size")
        if reduction != "sum_over_batch_size":
            raise ValueError(
                f"LabelSmoothedCrossEntropy always averages over the real tokens; reduction="
                f"{reduction!r} is not supported (call() returns the per-token losses)."
            )
        super().__init__(name=name, **kwargs)
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}.")
        self.label_smoothing = label_smoothing
        self.pad_id = pad_id

    def call(self, y_true, y_pred):
        """Per-token losses `[B, T]`, zero at padding."""
        labels = ops.cast(y_true, "int32")
        losses = _smoothed_token_loss(y_pred, labels, self.label_smoothing)
        return ops.where(labels != self.pad_id, losses, 0.0)

    def __call__(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        weights = _token_weights(labels, self.pad_id, sample_weight)
        # Keras sums the replicas' gradients: dividing each replica's sum by the
        # global count makes that sum the gradient of the global mean.
        weights = weights / ops.maximum(_sum_over_replicas(ops.sum(weights)), 1.0)
        if keras.backend.backend() == "tensorflow" and compat.gradient_may_be_recorded():
            return _weighted_loss_tf(y_pred, labels, weights, self.label_smoothing)
        # Evaluation: no gradient to compute ahead (and this is differentiable all the same).
        return ops.sum(self.call(labels, y_pred) * weights)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


def _token_weights(labels, pad_id, sample_weight=None):
    """float32 `[B, T]`: 1 for real tokens, 0 at padding, times `sample_weight` (`[B]` per sentence or `[B, T]`)."""
    weights = ops.cast(labels != pad_id, "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.cast(sample_weight, "float32")
    while len(sample_weight.shape) < len(weights.shape):
        sample_weight = sample_weight[..., None]
    return weights * sample_weight


def _argmax(logits):
    """int32 index of the largest logit over the last axis (the first one of ties).

    On TensorFlow, `tf.argmax` itself: Keras' `ops.argmax` first rewrites
    -0.0 (a flush-to-zero workaround) in five more passes over the logits,
    which made it 3.5x slower than the argmax and the accuracy metric ~7% of
    a small model's training step. Logits of -0.0 and 0.0 compare equal
    either way.
    """
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.argmax(logits, axis=-1, output_type=tf.int32)
    return ops.cast(ops.argmax(logits, axis=-1), "int32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Mean):
    """Teacher-forced token accuracy over non-padding tokens.

    A token counts as right when its label is the argmax of its logits, as in
    `keras.metrics.SparseCategoricalAccuracy`: of tied maximal logits only
    one is the prediction, the first index (what argmax returns on CPU and
    under XLA, and the token greedy decoding's argmax picks). Comparing the
    label's logit with the maximum instead counted every tied label right,
    which overstated accuracy on bf16 logits, where ties are common. One
    argmax-reduction over the logits, as cheap as the max it replaces.
    """

    def __init__(self, pad_id=PAD_ID, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        predictions = _argmax(y_pred)
        correct = ops.cast(ops.equal(predictions, labels), "float32")
        return super().update_state(correct, sample_weight=_token_weights(labels, self.pad_id, sample_weight))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
