"""The machine this process runs on: CPU flags and identity, GPU compute capabilities, and the precision they favour.

Training (`keras_transformer.training`) picks its dtype policy here and
inference (`keras_transformer.inference.precision`) its decoding precision:
both ask this module, which imports nothing of the package, so that neither
pipeline package needs the other to know the hardware.

Mixed precision only pays where the hardware computes in 16 bits; elsewhere
it is emulated and slower than float32 (measurements in
`benchmarks/README.md`). Everything here reads Linux's `/proc/cpuinfo`, the
environment and TensorFlow's device list; nothing is cached, and each reader
takes its source as an argument so that tests can describe another machine.
"""

import os

# CPU flags (Linux /proc/cpuinfo) of native bfloat16 arithmetic.
BFLOAT16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# Values of oneDNN's ONEDNN_MAX_CPU_ISA (older name DNNL_MAX_CPU_ISA) below AVX512_CORE_BF16, its first
# instruction set with bfloat16 dot products: under such a cap oneDNN emulates bfloat16 whatever the CPU has.
ONEDNN_ISAS_WITHOUT_BFLOAT16 = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI")


def cpuinfo_value(key, cpuinfo_path="/proc/cpuinfo"):
    """The first value of `key` in /proc/cpuinfo, or None.

    Args:
        key: a field name: "flags", "model name", "vendor_id", "cpu family", "model"...
        cpuinfo_path: the file to read (a missing file gives None).

    Returns:
        The value as a str, stripped, or None where the file or the key does not exist.
    """
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
    """The CPU's feature flags: a set of str, empty where /proc/cpuinfo does not exist."""
    return set((cpuinfo_value("flags", cpuinfo_path) or "").split())


def cpu_identity(cpuinfo_path="/proc/cpuinfo"):
    """The CPU's model name, family and model number, as far as /proc/cpuinfo gives them.

    A virtual machine's model name can be as bare as "AMD EPYC": the family
    and model numbers tell its generations apart.

    Returns:
        A dict with the keys among `cpu` (str), `cpu_family` and `cpu_model`
        (int) that /proc/cpuinfo answers; empty without it.
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
    """Compute capabilities `(major, minor)` of the visible GPUs (empty without GPUs); imports TensorFlow."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    return [tf.config.experimental.get_device_details(gpu).get("compute_capability") or (0, 0) for gpu in gpus]


def onednn_isa_cap(environ=None):
    """The instruction set oneDNN is capped at (`ONEDNN_MAX_CPU_ISA`, upper-cased), or None.

    Args:
        environ: the environment to read (default `os.environ`).
    """
    environ = os.environ if environ is None else environ
    cap = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    return cap.strip().upper() if cap and cap.strip() else None


def auto_precision(cpuinfo_path="/proc/cpuinfo", gpu_capabilities=None, environ=None):
    """The Keras dtype policy that trains fastest here, and why.

    - GPUs: "mixed_bfloat16" if every visible GPU has compute capability 8.0
      or more (bfloat16 needs no loss scaling), "mixed_float16" from 7.0
      (float16 tensor cores), else "float32".
    - CPU only: "mixed_bfloat16" if the CPU has AVX512_BF16 or AMX-BF16
      instructions, unless `ONEDNN_MAX_CPU_ISA` caps oneDNN below
      AVX512_CORE_BF16 (e.g. `AVX2`), under which oneDNN emulates bfloat16;
      else "float32".

    Args:
        cpuinfo_path: the CPU's /proc/cpuinfo.
        gpu_capabilities: a list of `(major, minor)`; default
            `gpu_compute_capabilities()`.
        environ: the environment (default `os.environ`).

    Returns:
        `(policy, reason)`: a Keras dtype policy name and a sentence that says why.

    Example:
        >>> import pathlib, tempfile
        >>> cpuinfo = pathlib.Path(tempfile.mkdtemp()) / "cpuinfo"
        >>> _ = cpuinfo.write_text("flags\\t: avx2 avx512_bf16\\n")
        >>> auto_precision(cpuinfo, gpu_capabilities=[], environ={})
        ('mixed_bfloat16', 'the CPU has avx512_bf16')
        >>> auto_precision(cpuinfo, gpu_capabilities=[(7, 5)])[0]
        'mixed_float16'
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
