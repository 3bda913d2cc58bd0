"""tf.distribute helpers: the strategy for this machine, and cross-replica sums.

TensorFlow-specific on purpose; the layers and the model do not import it.
"""

import json
import logging
import os

import tensorflow as tf

logger = logging.getLogger(__name__)


def sum_over_replicas(value):
    """Sum of `value` over the replicas of the current strategy (itself outside one)."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def get_strategy():
    """The strategy for this process (the caller creates the model under its scope).

    - `TF_CONFIG` names a cluster: MultiWorkerMirroredStrategy.
    - Two or more visible GPUs: MirroredStrategy over all of them.
    - Otherwise the default strategy (one GPU, or the CPU).
    """
    if os.environ.get("TF_CONFIG"):
        cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
        if sum(len(tasks) for tasks in cluster.values()) > 1:
            strategy = tf.distribute.MultiWorkerMirroredStrategy()
            logger.info("MultiWorkerMirroredStrategy with %d replicas", strategy.num_replicas_in_sync)
            return strategy
    gpus = tf.config.list_logical_devices("GPU")
    if len(gpus) > 1:
        strategy = tf.distribute.MirroredStrategy([gpu.name for gpu in gpus])
        logger.info("MirroredStrategy over %d GPUs", len(gpus))
        return strategy
    return tf.distribute.get_strategy()
