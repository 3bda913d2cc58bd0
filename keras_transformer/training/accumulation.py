"""Gradient accumulation: one optimizer update from K batches, the update of one batch K times larger (§5.1).

§5.1: "Each training batch contained a set of sentence pairs containing
approximately 25000 source tokens and 25000 target tokens", spread over 8
GPUs (§5.2). On fewer devices, `TrainingArgs.accumulate_steps` K updates
the weights once every K batches of `batch_tokens` (fairseq's
`--update-freq`, Marian's `--optimizer-delay`, OpenNMT-tf's `accum_steps`).

The update is that of the one batch made of the K batches. The loss of a
batch is the mean over its real tokens, of all replicas
(`losses.LabelSmoothedCrossEntropy`), so if batch i holds n_i real tokens
and g_i is the gradient of its mean, the gradient of the mean over the K
batches is

    g = (n_1 g_1 + ... + n_K g_K) / (n_1 + ... + n_K)

and not the mean of the g_i: batches made by length hold different numbers
of tokens. Each replica adds n_i times its part of g_i into float32
accumulators of its own (one per weight); the K-th batch divides their sum
by the token count of the K batches and applies the optimizer once, which
sums the replicas' gradients as it does without accumulation. The
optimizer counts updates (`iterations`), so the learning rate of equation
(3) (§5.3), Adam's bias correction, the fused Adam kernel and `--ema`'s
moving average all see one step per update, and a checkpoint, written
between updates, has nothing accumulated to lose. Under `mixed_float16`
the sums are of scaled gradients: the loss-scale optimizer unscales them,
and skips the update if any of the K batches overflowed.

`model.fit` counts updates too: each of its steps takes K batches from its
data (give it K times as many batches as steps). K = 1 changes nothing:
`accumulate_gradients` leaves the model as it is.

Keras' optimizer argument `gradient_accumulation_steps` does not do this:
it applies the mean of the K gradients (the mean of per-batch means),
evaluates the learning-rate schedule at the count of batches while Adam's
bias correction counts updates, and moves `use_ema`'s average at every batch.
"""

import keras
import tensorflow as tf

from keras_transformer.losses import LabelSmoothedCrossEntropy, global_token_count


def accumulate_gradients(model, steps, forward=None):
    """Makes `model.fit` apply one update per `steps` batches, with the gradient of their global token mean.

    Args:
        model: a built `keras.Model` compiled with a `LabelSmoothedCrossEntropy`
            loss (a `Transformer`), under the strategy it will train with.
        steps: K, batches per update; 1 leaves `model` untouched.
        forward: None for Keras' forward pass and loss, or a function
            `(x, y, sample_weight) -> (loss, y_pred)` giving a batch's loss
            (a mean over its real tokens) and the predictions its metrics
            read (`rdrop.RDrop.forward`).

    Returns:
        the `GradientAccumulation` installed, or None for `steps` 1.

    Raises:
        ValueError: `steps` is not a positive integer, or the model's loss is
            not a mean over tokens.

    Example:
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> model.compile()
    >>> accumulate_gradients(model, 4).steps
    4
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"accumulate_steps must be a positive integer, got {steps!r}.")
    if steps == 1:
        return None
    accumulation = GradientAccumulation(model, steps, forward)
    model.make_train_function = accumulation.make_train_function
    model.train_function = None
    return accumulation


class GradientAccumulation:
    """The accumulators of one model and the `fit` train function that fills and applies them.

    Use `accumulate_gradients`, which installs it.

    Args:
        model: as for `accumulate_gradients`.
        steps: K >= 2, batches per update.
        forward: as for `accumulate_gradients`.
    """

    def __init__(self, model, steps, forward=None):
        if not isinstance(model.loss, LabelSmoothedCrossEntropy):
            raise ValueError(
                f"Gradient accumulation weights each batch by its real tokens, the mean LabelSmoothedCrossEntropy "
                f"takes; the model's loss is {type(model.loss).__name__}."
            )
        self.model = model
        self.steps = steps
        self.forward = forward or self._keras_forward
        self.train_function = None
        on_read = dict(
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )
        # One copy per replica (written in the replica's context); not model weights: never in a checkpoint.
        with model.distribute_strategy.scope():
            self.sums = [
                tf.Variable(tf.zeros(variable.shape, variable.dtype), name="accumulated_gradient", **on_read)
                for variable in model.trainable_variables
            ]
            self.tokens = tf.Variable(0.0, name="accumulated_tokens", **on_read)

    def reset(self):
        """Empties the accumulators (after an update cut short by the end of the data)."""
        for variable in self.sums + [self.tokens]:
            variable.assign(tf.zeros_like(variable))

    def make_train_function(self, force=False):
        """`fit`'s train function: per step, K batches from the iterator and one update (replaces Keras')."""
        if self.train_function is not None and not force:
            return self.train_function
        model, strategy = self.model, self.model.distribute_strategy

        def accumulate(data):
            strategy.run(self._replica_step, args=(data, False))

        def finish(data):
            logs = strategy.run(self._replica_step, args=(data, True))
            return {
                name: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None) for name, value in logs.items()
            }

        def update(iterator):
            for _ in range(self.steps - 1):
                accumulate(iterator.get_next())
            return finish(iterator.get_next())

        if not model.run_eagerly:
            accumulate = tf.function(accumulate, reduce_retracing=True, jit_compile=model.jit_compile)
            finish = tf.function(finish, reduce_retracing=True, jit_compile=model.jit_compile)
            update = tf.function(update, reduce_retracing=True)

        def train_function(iterator):
            logs = None
            for _ in range(model.steps_per_execution):
                try:
                    logs = update(iterator)
                except (tf.errors.OutOfRangeError, StopIteration):
                    self.reset()  # a part of an update: not applied
                    if logs is None:
                        raise StopIteration from None
                    break
            return logs

        self.train_function = model.train_function = train_function
        return train_function

    def _replica_step(self, data, apply):
        """One batch on one replica, Keras' train step but for the update: adds n_i g_i, or applies g (K-th batch)."""
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        gradients, y_pred = loss_and_gradients(model, self.forward, x, y, sample_weight)
        variables = model.trainable_variables
        tokens = global_token_count(y, model.loss.pad_id, sample_weight)
        # The loss divided its sum by max(tokens, 1): times that, the gradient of the sum.
        sums = [None if g is None else tf.convert_to_tensor(g) * tf.maximum(tokens, 1.0) for g in gradients]
        if apply:
            total = tf.maximum(self.tokens + tokens, 1.0)
            model.optimizer.apply_gradients(
                (None if s is None else (tf.identity(acc) + s) / total, variable)
                for s, acc, variable in zip(sums, self.sums, variables)
            )
            for variable in self.sums + [self.tokens]:
                variable.assign(tf.zeros_like(variable))
        else:
            for s, acc in zip(sums, self.sums):
                if s is not None:
                    acc.assign_add(s)
            self.tokens.assign_add(tokens)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def _keras_forward(self, x, y, sample_weight):
        """Keras' forward pass and loss of one batch: `(loss, y_pred)`."""
        y_pred = self.model(x, training=True)
        loss = self.model.compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
        return loss, y_pred


def loss_and_gradients(model, forward, x, y, sample_weight=None):
    """A batch's loss through `forward`, logged as Keras' train step logs it, and its gradients.

    The part of a Keras train step before the update, shared by gradient
    accumulation and R-Drop's train step: the loss of `forward`, the "loss"
    metric, the optimizer's loss scaling (`mixed_float16`) and the gradient.

    Args:
        model: the compiled model; its optimizer scales the loss.
        forward: `(x, y, sample_weight) -> (loss, y_pred)`.
        x, y, sample_weight: the batch, unpacked.

    Returns:
        `(gradients, y_pred)`: one gradient (of the scaled loss) or None per
        trainable variable, and the predictions the metrics read.
    """
    with tf.GradientTape() as tape:
        loss, y_pred = forward(x, y, sample_weight)
        update_loss_tracker(model, loss, x)
        scaled_loss = model.optimizer.scale_loss(loss)
    return tape.gradient(scaled_loss, model.trainable_variables), y_pred


def update_loss_tracker(model, loss, x):
    """Logs the batch's loss as Keras' train step does: its "loss" metric, weighted by the batch's sequences."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    tracker = next(metric for metric in model.metrics if metric.name == "loss")
    batch_size = tf.shape(next(value for value in tf.nest.flatten(x) if value is not None))[0]
    tracker.update_state(loss * replicas if replicas > 1 else loss, sample_weight=batch_size)
