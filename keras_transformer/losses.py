"""Label-smoothed cross-entropy and token accuracy that ignore padding (Vaswani et al., 2017, §5.4).

"During training, we employed label smoothing of value epsilon_ls = 0.1. This
hurts perplexity, as the model learns to be more unsure, but improves
accuracy and BLEU score." The smoothed target of Szegedy et al. (2016), the
paper's reference [36], is

    q(k) = (1 - epsilon) * [k = y] + epsilon / V

so the loss of one token with logits z is

    -sum_k q(k) log p(k) = logsumexp(z) - (1 - epsilon) z_y - (epsilon / V) sum_k z_k

with the closed-form gradient softmax(z) - q: no scatter, no one-hot in the
forward pass. The loss of a batch is the mean over its real tokens.

On TensorFlow, the same formula runs as the XLA kernels of
`keras_transformer.kernels.loss`, one line each below.
"""

import keras
from keras import ops

from keras_transformer import compat
from keras_transformer.kernels import loss as loss_kernel
from keras_transformer.special_ids import PAD_ID


def _token_losses(z, log_normalizer, labels, epsilon):
    """`logsumexp(z) - (1 - epsilon) z_y - (epsilon / V) sum_k z_k` per token, from float32 `z [..., V]`."""
    target_logit = ops.squeeze(ops.take_along_axis(z, labels[..., None], axis=-1), axis=-1)
    return log_normalizer - (1.0 - epsilon) * target_logit - epsilon * ops.mean(z, axis=-1)


def _smoothed_target(labels, vocab_size, epsilon):
    """q of each token, `[..., V]` float32: `(1 - epsilon) [k = y] + epsilon / V`."""
    return (1.0 - epsilon) * ops.one_hot(labels, vocab_size, dtype="float32") + epsilon / vocab_size


def smoothed_token_loss(logits, labels, epsilon):
    """Per-token label-smoothed cross-entropy, float32, with the closed-form gradient `softmax(z) - q` (§5.4).

    Any backend. A token whose upstream gradient is 0 (padding) gets a zero
    gradient, even from non-finite logits.

    Args:
        logits: `[..., V]`, any float dtype (computed in float32).
        labels: int `[...]`.
        epsilon: epsilon_ls.

    Returns:
        float32 `[...]`.

    Example:
    >>> float(smoothed_token_loss(ops.zeros((1, 10)), ops.array([3]), 0.1)[0])  # uniform: log V
    2.302585...
    """

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


def sum_over_replicas(value):
    """Sum of `value` over the replicas of the current `tf.distribute` strategy.

    `value` itself outside a replica context, with one replica, or on another
    backend. TensorFlow is imported here, not with the module: the model side
    imports this module and must not need the pipeline's TensorFlow.

    Example:
    >>> float(sum_over_replicas(ops.array(3.0)))  # one device: the value itself
    3.0
    """
    if keras.backend.backend() != "tensorflow":
        return value
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def token_weights(labels, pad_id, sample_weight=None):
    """float32 `[B, T]`: 1 for real tokens, 0 at padding, times `sample_weight` (`[B]` per sentence or `[B, T]`).

    Example:
    >>> ops.convert_to_numpy(token_weights(ops.array([[5, 7, 0]]), pad_id=0, sample_weight=ops.array([2.0]))).tolist()
    [[2.0, 2.0, 0.0]]
    """
    weights = ops.cast(ops.cast(labels, "int32") != pad_id, "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.cast(sample_weight, "float32")
    while len(sample_weight.shape) < len(weights.shape):
        sample_weight = sample_weight[..., None]
    return weights * sample_weight


def global_token_count(labels, pad_id, sample_weight=None):
    """float32 scalar: the real tokens (times `sample_weight`) of the global batch, all replicas together.

    What a `LabelSmoothedCrossEntropy` divides its sum by, so that N replicas
    take the mean of one device (§5.2's batch split over 8 GPUs).

    Example:
    >>> float(global_token_count(ops.array([[5, 7, 0], [4, 0, 0]]), pad_id=0))
    3.0
    """
    return sum_over_replicas(ops.sum(token_weights(labels, pad_id, sample_weight)))


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Sparse label-smoothed cross-entropy over logits, averaged over real tokens (§5.4).

    Tokens whose label is `pad_id` contribute nothing. The mean is taken over
    the real tokens of the whole global batch, also under a `tf.distribute`
    strategy (each replica divides its sum by the all-reduced token count), so
    one device and N replicas train alike.

    On TensorFlow, when a gradient tape records where the loss is called
    (eagerly, or while a function is traced, as `fit`'s step is), the mean
    and its gradient come from one pass over the logits
    (`kernels.loss.weighted_loss_with_gradient`). Otherwise (`evaluate`'s
    step; a function traced without a tape and differentiated later) the
    per-token losses of `call()` are summed and differentiated the usual way.

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
        if keras.backend.backend() == "tensorflow":
            losses = loss_kernel.xla_compiled(smoothed_token_loss)(y_pred, labels, self.label_smoothing)
        else:
            losses = smoothed_token_loss(y_pred, labels, self.label_smoothing)
        return ops.where(labels != self.pad_id, losses, 0.0)

    def __call__(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        # Keras sums the replicas' gradients: dividing each replica's sum by the
        # global count makes that sum the gradient of the global mean.
        weights = token_weights(labels, self.pad_id, sample_weight)
        weights = weights / ops.maximum(sum_over_replicas(ops.sum(weights)), 1.0)
        if keras.backend.backend() == "tensorflow" and compat.gradient_may_be_recorded():
            return loss_kernel.weighted_loss_with_gradient(y_pred, labels, weights, self.label_smoothing)
        # Evaluation: no gradient to compute ahead (and this is differentiable all the same).
        return ops.sum(self.call(labels, y_pred) * weights)

    def get_config(self):
        return {"name": self.name, "label_smoothing": self.label_smoothing, "pad_id": self.pad_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(keras.metrics.Mean):
    """Teacher-forced token accuracy over non-padding tokens.

    A token counts as right when its label is the argmax of its logits, as in
    `keras.metrics.SparseCategoricalAccuracy`: of tied maximal logits only
    one is the prediction, the first index (what argmax returns on CPU and
    under XLA, and the token greedy decoding's argmax picks), so ties,
    common in bfloat16 logits, do not count every tied label right. On
    TensorFlow the argmax is `kernels.loss.argmax`.

    Args:
        pad_id: label id to ignore.
        name: the metric's name.

    Example:
    >>> metric = MaskedAccuracy()
    >>> logits = ops.one_hot(ops.array([[2, 3, 1]]), 5)  # predicts 2, 3, 1
    >>> _ = metric.update_state(ops.array([[2, 4, 0]]), logits)  # right, wrong, padding
    >>> float(metric.result())
    0.5
    """

    def __init__(self, pad_id=PAD_ID, name="accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.pad_id = pad_id

    def update_state(self, y_true, y_pred, sample_weight=None):
        labels = ops.cast(y_true, "int32")
        if keras.backend.backend() == "tensorflow":
            predictions = loss_kernel.argmax(y_pred)
        else:
            predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        correct = ops.cast(ops.equal(predictions, labels), "float32")
        return super().update_state(correct, sample_weight=token_weights(labels, self.pad_id, sample_weight))

    def get_config(self):
        return {**super().get_config(), "pad_id": self.pad_id}
