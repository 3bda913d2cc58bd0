"""Deprecated: `keras_transformer.distribute` is now `keras_transformer.training.strategy` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.distribute moved to keras_transformer.training.strategy; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.training.strategy import *  # noqa: E402,F401,F403


def sum_over_replicas(value):
    """Deprecated: the loss sums over replicas itself (`keras_transformer.losses`)."""
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)
