"""TensorFlow's thread pools for the commands that translate: each batch in flight gets its share of the cores.

`Translator.translate` keeps `DEFAULT_TRANSLATE_WORKERS` batches in flight. With
TensorFlow's default pools, every op of either batch may spread over all the
cores, and the two batches' ops contend for them. Computing each batch's ops on
`cores // workers` threads, with `workers` ops at a time, is how TF Serving is set
up for requests in flight (`--tensorflow_intra_op_parallelism`,
`--tensorflow_inter_op_parallelism`); it translated test2016 faster through
`translate` on a 2-core CPU (benchmarks/README.md, "Batching of translate").

TensorFlow makes its pools once, when its runtime starts, so `set_pools_for`
must run before anything computes. A user who sets `TF_NUM_INTRAOP_THREADS` or
`TF_NUM_INTEROP_THREADS` keeps the pools they asked for.
"""

import os

# Read by TensorFlow when its runtime starts.
THREAD_ENVIRONMENT = ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def available_cores():
    """The cores this process may run on: its CPU affinity where the OS tells it, else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity outside Linux
        return os.cpu_count() or 1


def pools_for(workers, cores=None):
    """`(intra_op_threads, inter_op_threads)` for `workers` batches in flight on `cores` (default: this process's)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}.")
    cores = available_cores() if cores is None else cores
    return max(1, cores // workers), workers


def set_pools_for(workers):
    """Sets TensorFlow's pools to `pools_for(workers)`; returns them, or None where they were left as they are.

    Left as they are: when the environment sets either pool (`THREAD_ENVIRONMENT`),
    or when TensorFlow's runtime has already started (its pools are made).
    """
    if any(os.environ.get(name) for name in THREAD_ENVIRONMENT):
        return None
    import tensorflow as tf

    intra, inter = pools_for(workers)
    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra)
        tf.config.threading.set_inter_op_parallelism_threads(inter)
    except RuntimeError:  # "cannot be modified after initialization"
        return None
    return intra, inter
