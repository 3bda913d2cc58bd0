"""Decoding precision: "auto" picks bfloat16 where the CPU computes it natively, and exports record it."""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.inference import precision
from keras_transformer.inference.precision import auto_decoding_precision, resolve_decoding_precision
from keras_transformer.inference.saved_model import export_saved_model
from keras_transformer.inference.translator import Translator

SOURCES = ["A dog runs on the beach.", "Two men are playing soccer.", "", "A girl in a red coat jumps."]


def _cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: fpu sse2 {flags}\n")
    return str(path)


@pytest.mark.parametrize(
    "flags, gpus, expected",
    [
        ("avx2 avx512f avx512_bf16", [], "bfloat16"),
        ("avx2 amx_bf16", [], "bfloat16"),
        ("avx2 avx512f", [], "float32"),
        ("avx2", [(8, 0)], "bfloat16"),
        ("avx2", [(7, 5)], "mixed_float16"),
        ("avx2", [(6, 1)], "float32"),
    ],
)
def test_auto_decoding_precision(tmp_path, flags, gpus, expected):
    policy, reason = auto_decoding_precision(_cpuinfo(tmp_path, flags), gpu_capabilities=gpus)
    assert policy == expected and reason


def test_resolve_decoding_precision():
    assert resolve_decoding_precision(None) == (None, None)
    assert resolve_decoding_precision("float32") == ("float32", None)
    policy, reason = resolve_decoding_precision("auto")
    assert policy == auto_decoding_precision()[0] and reason.startswith("auto: ")
    with pytest.raises(ValueError, match="precision must be 'auto' or one of"):
        resolve_decoding_precision("float64")


@pytest.fixture
def native_bfloat16(monkeypatch):
    """This machine as one with AVX512_BF16, whatever the CPU running the tests."""
    monkeypatch.setattr(precision, "auto_precision", lambda *a, **k: ("mixed_bfloat16", "the CPU has avx512_bf16"))


def _export_info(path):
    with open(os.path.join(path, "assets", "export.json")) as f:
        return json.load(f)


def test_export_auto_is_bfloat16_on_a_bfloat16_cpu(tiny_run_dir, tmp_path, native_bfloat16):
    """The default export stores bfloat16 weights there, records why, and serves what the in-process
    bfloat16 Translator answers."""
    path = export_saved_model(tiny_run_dir, str(tmp_path / "auto"), max_extra_length=6)
    info = _export_info(path)
    assert info["precision"] == "bfloat16"
    assert info["precision_choice"] == "auto: the CPU has avx512_bf16"
    loaded = tf.saved_model.load(path)
    assert {v.dtype for v in loaded.model_variables if v.dtype.is_floating} == {tf.bfloat16}
    served = loaded.signatures["serving_default"](inputs=tf.constant(SOURCES))
    in_process = Translator.from_run_dir(tiny_run_dir, dtype="auto", max_extra_length=6)
    assert in_process.model.dtype_policy.name == "bfloat16"
    expected = in_process.translate_strings(tf.constant(SOURCES))
    assert list(served["translations"].numpy()) == list(expected["translations"].numpy())
    np.testing.assert_allclose(served["scores"].numpy(), expected["scores"].numpy(), atol=1e-5)
    assert served["translations"].numpy()[2] == b""


def test_export_auto_is_float32_elsewhere_and_flags_override(tiny_run_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(precision, "auto_precision", lambda *a, **k: ("float32", "the CPU has no native bfloat16"))
    base = str(tmp_path / "models")
    info = _export_info(export_saved_model(tiny_run_dir, base, version=1, max_extra_length=6))
    assert info["precision"] == "float32" and info["precision_choice"].startswith("auto: the CPU has no")
    # A precision asked for is used as given, on any machine.
    assert (
        cli.main(
            [
                "export",
                tiny_run_dir,
                "--output",
                base,
                "--version",
                "2",
                "--precision",
                "bfloat16",
                "--max-extra-length",
                "6",
            ]
        )
        == 0
    )
    info = _export_info(os.path.join(base, "2"))
    assert info["precision"] == "bfloat16" and info["precision_choice"] is None
    with pytest.raises(SystemExit):
        cli.main(["export", tiny_run_dir, "--output", base, "--precision", "float64"])
    assert "invalid choice: 'float64'" in capsys.readouterr().err


def test_export_of_a_translator_keeps_its_precision(tiny_run_dir, tmp_path, native_bfloat16):
    translator = Translator.from_run_dir(tiny_run_dir, dtype="float32", max_extra_length=6)
    info = _export_info(export_saved_model(translator, str(tmp_path / "t")))
    assert info["precision"] == "float32" and info["precision_choice"] is None
    with pytest.raises(ValueError, match="dtype applies to a run directory"):
        export_saved_model(translator, str(tmp_path / "t"), dtype="bfloat16")
