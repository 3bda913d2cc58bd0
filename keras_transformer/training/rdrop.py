"""R-Drop (Liang et al., 2021): each batch under two dropout masks, and the divergence of their predictions in the loss.

Not in the paper: an option of the training (`TrainingArgs.rdrop_alpha`,
`--rdrop-alpha`) whose default, 0, leaves the loss of §5.4 as it is.

Each training batch goes through the model as one batch of its sentences
twice over, so every dropout layer (§5.4) draws an independent mask for each
copy, and the loss adds to the label-smoothed cross-entropy of both passes
the symmetric KL divergence between their token distributions p1 and p2,
weighted by alpha (R-Drop's equation (3)):

    L = LS(p1) + LS(p2) + alpha * 1/2 (KL(p1 || p2) + KL(p2 || p1))

summed over the real target tokens. Both passes get the divergence's
gradient (neither is held fixed), as in R-Drop and in fairseq's
`label_smoothed_cross_entropy_with_rdrop` (`--rdrop-alpha`; 5 for IWSLT14
de-en with dropout 0.3). Here the sum is divided by twice the real tokens of
the global batch (all replicas), so the loss is the mean cross-entropy of the
two passes plus alpha / 2 times the mean symmetric divergence per token:
the sum's own ratio of the two terms, a loss that equals the usual one at
alpha 0, and the same updates from Adam, which ignores the loss's scale.

Per token, from the float32 log-probabilities of the two passes,

    KL(p1 || p2) + KL(p2 || p1) = sum_k (p1(k) - p2(k)) (log p1(k) - log p2(k)).

Under a gradient tape, its value and closed-form gradient come out of one
XLA-compiled pass (`kernels.divergence`), tested equal to `symmetric_kl`.

An update costs two passes of its batch: half the `batch_tokens` keeps its
cost. The accuracy and the token counts are those of the first pass. The
training `loss` is R-Drop's, divergence included, so it is not comparable
with `val_loss`, which stays the plain cross-entropy of one pass without
dropout. With an `RDropDivergence` among the model's metrics, the logs add
`rdrop_kl`, the epoch's mean symmetric divergence per token.
"""

import keras
import tensorflow as tf
from keras import ops

from keras_transformer import compat
from keras_transformer.kernels import divergence as divergence_kernel
from keras_transformer.losses import LabelSmoothedCrossEntropy, global_token_count, sum_over_replicas, token_weights
from keras_transformer.training.accumulation import loss_and_gradients


def symmetric_kl(logits_1, logits_2):
    """1/2 (KL(p1 || p2) + KL(p2 || p1)) of the softmaxes of two logits, per position, in float32.

    Args:
        logits_1, logits_2: `[..., V]`, any float dtype.

    Returns:
        float32 `[...]`, zero where the two distributions are equal.

    Example:
    >>> round(float(symmetric_kl(ops.array([[0.0, 0.0]]), ops.array([[0.0, 1.0]]))[0]), 4)
    0.1155
    """
    log_p1 = ops.log_softmax(ops.cast(logits_1, "float32"), axis=-1)
    log_p2 = ops.log_softmax(ops.cast(logits_2, "float32"), axis=-1)
    return 0.5 * ops.sum((ops.exp(log_p1) - ops.exp(log_p2)) * (log_p1 - log_p2), axis=-1)


def mean_symmetric_kl(logits, labels, pad_id, sample_weight=None, tokens=None):
    """This replica's part of the global batch's mean `symmetric_kl` per real target token.

    Args:
        logits: `[2B, T, V]`, the first pass's B rows then the second's.
        labels: int `[B, T]`, of one pass; `pad_id` marks padding.
        pad_id: the padding label.
        sample_weight: None, `[B]` or `[B, T]`.
        tokens: None, or the batch's `losses.global_token_count`, when the
            caller has it already (it is an all-reduce under distribution).

    Returns:
        float32 scalar: the sum over this replica's real tokens divided by
        the real tokens of all replicas (summed over replicas: the mean).

    Example:
    >>> logits = ops.array([[[0.0, 0.0]], [[0.0, 1.0]]])  # [2B = 2, T = 1, V = 2]: two passes of one token
    >>> round(float(mean_symmetric_kl(logits, ops.array([[1]]), pad_id=0)), 4)
    0.1155
    """
    if tokens is None:
        tokens = global_token_count(labels, pad_id, sample_weight)
    weights = token_weights(labels, pad_id, sample_weight) / ops.maximum(tokens, 1.0)
    if compat.gradient_may_be_recorded():  # training: value and gradient in one XLA pass
        return divergence_kernel.weighted_divergence_with_gradient(logits, weights)
    first, second = ops.split(logits, 2, axis=0)
    return ops.sum(symmetric_kl(first, second) * weights)


@keras.saving.register_keras_serializable(package="keras_transformer")
class RDropDivergence(keras.metrics.Mean):
    """The mean symmetric divergence per real target token of R-Drop's passes, over an epoch: `rdrop_kl`.

    Compile the model with it among its metrics and give it to `use_rdrop`:
    R-Drop's train step records each batch's divergence (`record`), weighted
    by its real tokens. Keras' own updates from the predictions do nothing,
    so validation reports 0.

    Example:
    >>> metric = RDropDivergence()
    >>> metric.record(0.5, 10.0); metric.record(2.0, 30.0)
    >>> float(metric.result())
    1.625
    """

    def __init__(self, name="rdrop_kl", **kwargs):
        super().__init__(name=name, **kwargs)

    def update_state(self, y_true=None, y_pred=None, sample_weight=None):
        """Nothing: the divergence needs both passes, which only the train step has."""

    def record(self, divergence, tokens):
        """Adds a batch's mean divergence `divergence` over its `tokens` real tokens."""
        super().update_state(divergence, sample_weight=tokens)


def use_rdrop(model, alpha, divergence=None):
    """Makes `model.fit` train `model` with R-Drop's loss, weighting the divergence by `alpha`.

    Install it before `accumulate_gradients`, and give that the returned
    `RDrop`'s `forward`.

    Args:
        model: a `Transformer` compiled with a `LabelSmoothedCrossEntropy`
            loss, under the strategy it will train with.
        alpha: the divergence's weight, >= 0; 0 leaves `model` untouched.
        divergence: None, or an `RDropDivergence` among the model's compiled
            metrics, to log the divergence as `rdrop_kl`.

    Returns:
        the `RDrop` installed, or None for alpha 0.

    Raises:
        ValueError: alpha is not a number >= 0, or the model's loss is not a
            `LabelSmoothedCrossEntropy`.

    Example:
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> divergence = RDropDivergence()
    >>> model.compile(metrics=[divergence])
    >>> use_rdrop(model, 5.0, divergence).alpha
    5.0
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha >= 0:
        raise ValueError(f"rdrop_alpha must be a number >= 0, got {alpha!r}.")
    if alpha == 0:
        return None
    if not isinstance(model.loss, LabelSmoothedCrossEntropy):
        raise ValueError(
            f"R-Drop adds its divergence over the real tokens a LabelSmoothedCrossEntropy averages over; the "
            f"model's loss is {type(model.loss).__name__}."
        )
    rdrop = RDrop(model, float(alpha), divergence)
    model.train_step = rdrop.train_step
    model.train_function = None
    return rdrop


class RDrop:
    """R-Drop's forward pass and loss, and the `fit` train step that uses them. Use `use_rdrop`, which installs it.

    Args:
        model: as for `use_rdrop`.
        alpha: the divergence's weight, > 0.
        divergence: as for `use_rdrop`.
    """

    def __init__(self, model, alpha, divergence=None):
        self.model = model
        self.alpha = alpha
        self.divergence = divergence

    def forward(self, x, y, sample_weight=None):
        """Both passes of a training batch and their loss; records the divergence in `divergence`.

        Args:
            x: the model's inputs `(source_ids, target_ids)`, `[B, ...]` each.
            y: labels `[B, T]`.
            sample_weight: None, `[B]` or `[B, T]`.

        Returns:
            `(loss, logits)`: the loss of the module docstring (this
            replica's part) and the first pass's logits `[B, T, V]`, which
            the metrics read.
        """
        model = self.model
        logits = model(_twice(x), training=True)
        cross_entropy = model.compute_loss(
            x=x, y=_twice(y), y_pred=logits, sample_weight=_twice(sample_weight), training=True
        )
        tokens = global_token_count(y, model.loss.pad_id, sample_weight)
        kl = mean_symmetric_kl(logits, y, model.loss.pad_id, sample_weight, tokens=tokens)
        if self.divergence is not None:
            self.divergence.record(sum_over_replicas(kl), tokens)
        return cross_entropy + 0.5 * self.alpha * kl, ops.split(logits, 2, axis=0)[0]

    def train_step(self, data):
        """Keras' train step with `forward`'s loss.

        Args:
            data: a batch `(x, y)` or `(x, y, sample_weight)`.

        Returns:
            the model's metrics after the update (`rdrop_kl` among them when
            `divergence` is).
        """
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        gradients, y_pred = loss_and_gradients(model, self.forward, x, y, sample_weight)
        model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


def _twice(value):
    """The batch of both passes: `value`'s rows, then the same rows again.

    Args:
        value: a tensor, a tuple of tensors (the model's inputs) or None.

    Returns:
        the same structure with twice the rows; None for None.
    """
    if value is None:
        return None
    return tf.nest.map_structure(lambda t: ops.concatenate([t, t], axis=0), value)
