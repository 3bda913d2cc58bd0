"""benchmarks/recipe_time.py: a recipe's seconds per update, natively and with oneDNN capped at AVX2."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import recipe_time  # noqa: E402
import reproduce_multi30k as published  # noqa: E402


def test_seconds_per_update_leaves_out_the_first_updates():
    marks = [(1, 0.0), (2, 10.0), (3, 11.0), (4, 12.5), (5, 13.0)]
    assert recipe_time.seconds_per_update(marks, skip=2) == pytest.approx(1.0)  # (13 - 10) / (5 - 2)
    with pytest.raises(ValueError, match="1 updates after --skip 5"):
        recipe_time.seconds_per_update(marks, skip=5)


def test_the_avx2_setting_caps_onednn_and_leaves_its_rewrites_off(monkeypatch):
    """What an AVX2-only CPU gets: oneDNN at most AVX2, TensorFlow's oneDNN rewrites off, so float32 training."""
    from keras_transformer.hardware import auto_precision

    seen = []
    monkeypatch.setattr(recipe_time.common, "json_from_process", lambda command, label, env: seen.append(env) or {})
    args = recipe_time.argparse.Namespace(trial="mini_12k", updates=3, skip=1, limit=None, repeats=2)
    rows = recipe_time.measure(args)
    assert [len(results) for results in rows.values()] == [2, 2]
    native, avx2 = seen[0], seen[1]
    assert avx2["ONEDNN_MAX_CPU_ISA"] == "AVX2" and avx2["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert native.get("ONEDNN_MAX_CPU_ISA") == os.environ.get("ONEDNN_MAX_CPU_ISA")
    assert auto_precision(gpu_capabilities=[], environ=avx2)[0] == "float32"


def test_summary_scales_the_emulated_hours_by_the_calibration():
    rows = {
        "native": [dict(seconds_per_update=0.5, dtype_policy="mixed_bfloat16")],
        "avx2": [dict(seconds_per_update=1.5, dtype_policy="float32")],
    }
    args = recipe_time.argparse.Namespace(trial="mini_12k")
    calibration = dict(real_avx2_tokens_per_sec=1000.0, emulated_tokens_per_sec=1500.0, emulated_over_real=1.5)
    out = recipe_time.summary(args, rows, 12000, calibration)
    assert out["avx2_over_native"] == 3.0
    assert out["settings"]["native"]["run_hours"] == pytest.approx(1.67, abs=0.01)
    assert out["settings"]["avx2"]["run_hours"] == 5.0 and out["real_avx2_run_hours"] == 7.5


def test_the_worker_trains_the_recipe_and_times_its_updates(tmp_path, monkeypatch, capsys):
    tiny = dict(preset="tiny", vocab_size=400, batch_tokens=256, validate_bleu_every=None, precision="mixed_bfloat16")
    for key, value in tiny.items():
        monkeypatch.setitem(published.RECIPE, key, value)
    recipe_time.worker("published", updates=5, skip=2, output=str(tmp_path / "run"), limit=60)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["updates"] == 5 and result["seconds_per_update"] > 0
    assert result["dtype_policy"] == "mixed_bfloat16" and result["steps_per_epoch"] >= 1  # the run's, not the default


def test_skip_must_leave_updates_to_time():
    with pytest.raises(SystemExit):
        recipe_time.main(["--updates", "10", "--skip", "10"])


def test_results_file_records_its_provenance(tmp_path, monkeypatch):
    rows = {name: [dict(seconds_per_update=1.0, dtype_policy="float32")] for name in recipe_time.SETTINGS}
    monkeypatch.setattr(recipe_time, "measure", lambda args: rows)
    path = tmp_path / "recipe_time.json"
    recipe_time.main(["--updates", "100", "--json", str(path)])
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["command"].startswith("python ") and "commit" in payload and payload["cpu_flags"]
    assert payload["settings"]["avx2"]["run_hours"] == round(payload["max_steps"] / 3600, 2)
