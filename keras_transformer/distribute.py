"""tf.distribute helpers: the strategy and the precision for this machine, cross-replica sums.

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


# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's feature flags (a set of str; empty where /proc/cpuinfo does not exist)."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def auto_precision(cpuinfo_path="/proc/cpuinfo"):
    """The Keras dtype policy that trains fastest here, and why: `(policy, reason)`.

    Mixed precision only pays where the hardware computes in 16 bits; elsewhere
    it is emulated, and slower than float32 (on an AVX2-only CPU, a
    mixed_bfloat16 training step of the small model took 1.3x as long as a
    float32 one: 1,842 vs 1,426 ms, `benchmarks/train_throughput.py`):

    - GPUs: "mixed_bfloat16" if every visible GPU has compute capability 8.0
      or more (Ampere: bf16 needs no loss scaling), "mixed_float16" from 7.0
      (Volta tensor cores), else "float32".
    - CPU only: "mixed_bfloat16" if the CPU has AVX512_BF16 or AMX-BF16
      instructions, else "float32".
    """
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        capabilities = [tf.config.experimental.get_device_details(gpu).get("compute_capability") for gpu in gpus]
        lowest = min((c or (0, 0)) for c in capabilities)
        if lowest >= (8, 0):
            return "mixed_bfloat16", f"GPUs of compute capability >= {lowest[0]}.{lowest[1]}"
        if lowest >= (7, 0):
            return "mixed_float16", f"GPUs of compute capability {lowest[0]}.{lowest[1]} (no bfloat16)"
        return "float32", f"GPUs of compute capability {lowest[0]}.{lowest[1]} (no fast 16-bit arithmetic)"
    native = sorted(cpu_flags(cpuinfo_path) & set(BFLOAT16_CPU_FLAGS))
    if native:
        return "mixed_bfloat16", f"the CPU has {', '.join(native)}"
    return "float32", "the CPU has no native bfloat16 (avx512_bf16 or amx_bf16)"
