"""tf.distribute for training: the strategy, the precision for this machine, and who is chief.

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


# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Values of oneDNN's ONEDNN_MAX_CPU_ISA (older name DNNL_MAX_CPU_ISA) below AVX512_CORE_BF16, its first
# instruction set with bfloat16 dot products: under such a cap oneDNN emulates bfloat16 whatever the CPU has.
ONEDNN_ISAS_WITHOUT_BFLOAT16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpuinfo_value(key, cpuinfo_path="/proc/cpuinfo"):
    """The first value of `key` in /proc/cpuinfo ("flags", "model name", "vendor_id"), or None."""
    try:
        with open(cpuinfo_path, encoding="utf-8", errors="replace") as f:
            for line in f:
                name, colon, value = line.partition(":")
                if colon and name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's feature flags (a set of str; empty where /proc/cpuinfo does not exist)."""
    return set((cpuinfo_value("flags", cpuinfo_path) or "").split())


def cpu_identity(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's model name, family and model number, as far as /proc/cpuinfo gives them.

    A virtual machine's model name can be as bare as "AMD EPYC": the family and
    model numbers tell its generations apart (AMD family 25 is Zen 3 and 4, 26 is
    Zen 5), and with them how far a time budget gets.
    """
    identity = {}
    cpu = cpuinfo_value("model name", cpuinfo_path)
    if cpu is not None:
        identity["cpu"] = cpu
    for key, name in (("cpu family", "cpu_family"), ("model", "cpu_model")):
        value = cpuinfo_value(key, cpuinfo_path)
        if value is not None and value.isdigit():
            identity[name] = int(value)
    return identity


def gpu_compute_capabilities():
    """Compute capabilities `(major, minor)` of the visible GPUs (empty without GPUs)."""
    gpus = tf.config.list_physical_devices("GPU")
    return [tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0) for gpu in gpus]


def onednn_isa_cap(environ=None):
    """The instruction set oneDNN is capped at (`ONEDNN_MAX_CPU_ISA`, upper-cased), or None."""
    environ = os.environ if environ is None else environ
    cap = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    return cap.strip().upper() if cap and cap.strip() else None


def auto_precision(cpuinfo_path="/proc/cpuinfo", gpu_capabilities=None, environ=None):
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

      Not when `ONEDNN_MAX_CPU_ISA` caps oneDNN below AVX512_CORE_BF16
      (e.g. `AVX2`): oneDNN then emulates bfloat16.

    `cpuinfo_path`, `gpu_capabilities` (a list of `(major, minor)`,
    default `gpu_compute_capabilities()`) and `environ` (default
    `os.environ`) describe the machine.
    """
    if gpu_capabilities is None:
        gpu_capabilities = gpu_compute_capabilities()
    if gpu_capabilities:
        lowest = min(tuple(c) for c in gpu_capabilities)
        if lowest >= (8, 0):
            return "mixed_bfloat16", f"GPUs of compute capability >= {lowest[0]}.{lowest[1]}"
        if lowest >= (7, 0):
            return "mixed_float16", f"GPUs of compute capability {lowest[0]}.{lowest[1]} (no bfloat16)"
        return "float32", f"GPUs of compute capability {lowest[0]}.{lowest[1]} (no fast 16-bit arithmetic)"
    native = sorted(cpu_flags(cpuinfo_path) & set(BFLOAT16_CPU_FLAGS))
    cap = onednn_isa_cap(environ)
    if native and cap in ONEDNN_ISAS_WITHOUT_BFLOAT16:
        return "float32", f"ONEDNN_MAX_CPU_ISA={cap} keeps oneDNN from the CPU's {', '.join(native)}"
    if native:
        return "mixed_bfloat16", f"the CPU has {', '.join(native)}"
    return "float32", "the CPU has no native bfloat16 (avx512_bf16 or amx_bf16)"


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
        raise ValueError(
            "--time-budget is not supported with MultiWorkerMirroredStrategy (TF_CONFIG): each "
            "worker would stop at its own step. Pass --time-budget none and use --max-steps or "
            "--epochs."
        )


def check_batch_multiple(batch_multiple, num_replicas):
    """Refuses a `batch_multiple` the replicas cannot share: each global batch must split evenly over them.

    Args:
        batch_multiple: `TrainingArgs.batch_multiple` (None: the replica count).
        num_replicas: the strategy's `num_replicas_in_sync`.
    """
    if batch_multiple is not None and batch_multiple % num_replicas:
        raise ValueError(
            f"--batch-multiple {batch_multiple} is not a multiple of the {num_replicas} replicas: a global batch "
            f"of a multiple of {batch_multiple} sequences would not split evenly over them. Pass a multiple of "
            f"{num_replicas} (e.g. {num_replicas * -(-batch_multiple // num_replicas)}) or leave --batch-multiple "
            "out (the replica count)."
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
