"""The machine (keras_transformer.hardware): CPU flags and identity, GPU capabilities, the precision they favour.

Machines are described by a cpuinfo file, a list of GPU compute capabilities
and an environment, so every case runs on any machine.
"""

import pytest

from keras_transformer import hardware


@pytest.mark.parametrize(
    "flags, expected",
    [
        ("fpu sse sse2 avx fma avx2", "float32"),
        ("avx2 avx512f avx512_bf16 avx512_vnni", "mixed_bfloat16"),
        ("avx2 amx_bf16 amx_tile", "mixed_bfloat16"),
    ],
)
def test_auto_precision_follows_the_cpus_bfloat16_support(tmp_path, flags, expected):

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: {flags}\n\n")
    policy, reason = hardware.auto_precision(str(cpuinfo), gpu_capabilities=())  # no GPU
    assert policy == expected
    assert ("no native bfloat16" in reason) == (expected == "float32")
    assert hardware.auto_precision(str(tmp_path / "missing"), gpu_capabilities=())[0] == "float32"


def test_cpu_identity_tells_cpu_generations_apart_by_family_and_model(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu avx2\n\nprocessor\t: 1\ncpu family\t: 26\n"
    )
    assert hardware.cpu_identity(cpuinfo) == {"cpu": "AMD EPYC", "cpu_family": 26, "cpu_model": 2}
    assert hardware.cpuinfo_value("vendor_id", cpuinfo) == "AuthenticAMD"
    assert hardware.cpuinfo_value("model", cpuinfo) == "2"  # not "model name"'s value
    assert hardware.cpu_flags(cpuinfo) == {"fpu", "avx2"}
    assert hardware.cpu_identity(tmp_path / "missing") == {}
    assert hardware.cpu_flags(tmp_path / "missing") == set()


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({}, "mixed_bfloat16"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX2"}, "float32"),
        ({"ONEDNN_MAX_CPU_ISA": "avx512_core"}, "float32"),  # oneDNN reads the value case-insensitively
        ({"DNNL_MAX_CPU_ISA": "AVX512_CORE_VNNI"}, "float32"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "mixed_bfloat16"),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}, "mixed_bfloat16"),
        ({"ONEDNN_MAX_CPU_ISA": "ALL"}, "mixed_bfloat16"),
        ({"ONEDNN_MAX_CPU_ISA": " "}, "mixed_bfloat16"),
    ],
)
def test_auto_precision_respects_a_onednn_instruction_set_cap(tmp_path, environ, expected):
    """Capped below AVX512_CORE_BF16, oneDNN emulates bfloat16 even on a CPU that has it: auto picks float32,
    in training and in decoding, and says why."""
    from keras_transformer.inference.precision import auto_decoding_precision

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: avx2 avx512f avx512_bf16 amx_bf16\n\n")
    policy, reason = hardware.auto_precision(str(cpuinfo), gpu_capabilities=(), environ=environ)
    assert policy == expected
    decoding, _ = auto_decoding_precision(str(cpuinfo), gpu_capabilities=(), environ=environ)
    assert decoding == {"float32": "float32", "mixed_bfloat16": "bfloat16"}[expected]
    if expected == "float32":
        isa = list(environ.values())[0].upper()
        assert reason == f"ONEDNN_MAX_CPU_ISA={isa} keeps oneDNN from the CPU's amx_bf16, avx512_bf16"


@pytest.mark.parametrize(
    "capabilities, expected",
    [
        ([(8, 0)], "mixed_bfloat16"),  # Ampere: bfloat16
        ([(9, 0), (8, 6)], "mixed_bfloat16"),
        ([(7, 5)], "mixed_float16"),  # Turing, Volta: float16 tensor cores, no bfloat16
        ([(7, 0)], "mixed_float16"),
        ([(6, 1)], "float32"),  # Pascal: no fast 16-bit arithmetic
        ([(8, 0), (7, 0)], "mixed_float16"),  # the lowest GPU decides
        ([(7, 0), (8, 0)], "mixed_float16"),
        ([(8, 0), (7, 5), (6, 0)], "float32"),
    ],
)
def test_auto_precision_on_gpus_follows_the_lowest_compute_capability(tmp_path, capabilities, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: avx2 avx512_bf16 amx_bf16\n\n")  # GPUs decide, not the CPU
    policy, reason = hardware.auto_precision(str(cpuinfo), gpu_capabilities=capabilities)
    assert policy == expected
    lowest = min(capabilities)
    assert f"compute capability {lowest[0]}.{lowest[1]}" in reason or f">= {lowest[0]}.{lowest[1]}" in reason


def test_auto_precision_asks_the_gpus_by_default(tmp_path, monkeypatch):
    import tensorflow as tf

    assert len(hardware.gpu_compute_capabilities()) == len(tf.config.list_physical_devices("GPU"))
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: avx2\n\n")
    monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: [(7, 5), (7, 5)])
    assert hardware.auto_precision(str(cpuinfo))[0] == "mixed_float16"
    monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: [])
    assert hardware.auto_precision(str(cpuinfo))[0] == "float32"
