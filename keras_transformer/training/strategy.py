"""tf.distribute for training: the strategy, who is chief, and what the replicas must agree on.

§5.2: "We trained our models on one machine with 8 NVIDIA P100 GPUs". Here
`get_strategy()` picks one device, MirroredStrategy over the local GPUs, or
MultiWorkerMirroredStrategy from `TF_CONFIG`; the global batch is split over
the replicas and the loss divided by the global token count
(`keras_transformer.losses`), so N replicas train exactly like one device.
"""

import json
import logging
import os

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.errors import ParameterError

logger = logging.getLogger(__name__)


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


def strategy_worker(strategy):
    """(is_chief, worker_index) for this process under `strategy`."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True, 0
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    cluster = resolver.cluster_spec().as_dict()
    if task_type == "chief":
        return True, 0
    if task_type == "worker" and task_id == 0 and "chief" not in cluster:
        return True, 0
    offset = 1 if "chief" in cluster else 0
    return False, task_id + offset


def check_time_budget(args, strategy):
    """Workers timing themselves would stop at different steps and leave the others waiting."""
    if args.time_budget is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise ParameterError(
            "time_budget",
            "is not supported with MultiWorkerMirroredStrategy (TF_CONFIG): each worker would stop at its "
            "own step. Give none and use max_steps or epochs.",
        )


def check_batch_multiple(batch_multiple, num_replicas):
    """Refuses a `batch_multiple` the replicas cannot share: each global batch must split evenly over them.

    Args:
        batch_multiple: `TrainingArgs.batch_multiple` (None: the replica count).
        num_replicas: the strategy's `num_replicas_in_sync`.
    """
    if batch_multiple is not None and batch_multiple % num_replicas:
        raise ParameterError(
            "batch_multiple",
            f"{batch_multiple} is not a multiple of the {num_replicas} replicas: a global batch of a multiple of "
            f"{batch_multiple} sequences would not split evenly over them. Give a multiple of {num_replicas} "
            f"(e.g. {num_replicas * -(-batch_multiple // num_replicas)}) or None (the replica count).",
        )


def work_around_keras_multiworker(model, strategy, element_spec):
    """Makes Keras 3 `fit`/`evaluate` run under MultiWorkerMirroredStrategy.

    Two Keras 3 bugs (seen up to 3.15; keras-team/keras#20585) break `fit`
    with MultiWorkerMirroredStrategy:

    1. Before training, Keras takes a batch from the distributed dataset and
       `strategy.reduce`s it to build the compiled loss and metrics, which
       fails on nested inputs ("Attempt to convert a value (PerReplica...) to
       a Tensor"). The build only needs shapes and dtypes: build from the
       dataset's `element_spec` under the scope and skip Keras's attempt.
    2. The step's metric results are reduced with
       `strategy.reduce("MEAN", value, axis=0)`, which fails on the scalar
       results ("Invalid reduction dimension 0 for input with 0 dimensions").
       The steps here return them with shape [1] instead; the monitor then
       replaces the logged values by the exact cross-replica metric results.
    """
    from keras import ops

    with strategy.scope():
        compat.build_model_from_spec(model, element_spec)

    def as_vectors(step):
        def wrapped(data):
            return {name: ops.reshape(value, [1]) for name, value in step(data).items()}

        return wrapped

    model.train_step = as_vectors(model.train_step)
    model.test_step = as_vectors(model.test_step)
