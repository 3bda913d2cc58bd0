"""benchmarks/recipe_time.py: a recipe's seconds per update, natively and with oneDNN capped at AVX2."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import recipe_time  # noqa: E402
import reproduce_multi30k as published  # noqa: E402


def test_the_timed_window_is_whole_epochs_after_the_first():
    # Epoch 1 ends after update 10 (its validation is traced there): timing runs from 11's batch end to 31's.
    assert recipe_time.timed_window(steps_per_epoch=10, epochs=2) == (11, 31)
    marks = [(10, 0.0), (11, 5.0), (12, 6.0), (13, 9.0)]  # update 11 ended after the first validation
    assert recipe_time.seconds_per_update(marks, 11, 13) == pytest.approx(2.0)
    with pytest.raises(ValueError, match=r"no marks of updates 11 and 14 \(4 updates trained\)"):
        recipe_time.seconds_per_update(marks, 11, 14)


def _cpuinfo(tmp_path, flags):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n", encoding="utf-8")
    return str(path)


def test_the_avx2_setting_caps_onednn_so_a_bfloat16_cpu_trains_in_float32(monkeypatch, tmp_path):
    """What an AVX2-only CPU gets: oneDNN at most AVX2 and TensorFlow's oneDNN rewrites off; the native setting
    changes nothing."""
    from keras_transformer.hardware import auto_precision

    seen = []
    monkeypatch.setattr(recipe_time.common, "json_from_process", lambda command, label, env: seen.append(env) or {})
    args = recipe_time.argparse.Namespace(trial="mini_12k", epochs=1, limit=None, repeats=2)
    rows = recipe_time.measure(args)
    assert [len(results) for results in rows.values()] == [2, 2]
    native, avx2 = seen[0], seen[1]
    assert avx2["ONEDNN_MAX_CPU_ISA"] == "AVX2" and avx2["TF_ENABLE_ONEDNN_OPTS"] == "0"
    assert native == dict(os.environ)
    bfloat16_cpu = _cpuinfo(tmp_path, "fpu avx2 avx512f avx512_bf16")
    assert auto_precision(bfloat16_cpu, gpu_capabilities=[], environ=native)[0] == "mixed_bfloat16"
    assert auto_precision(bfloat16_cpu, gpu_capabilities=[], environ=avx2)[0] == "float32"


def test_summary_gives_each_recipe_s_hours_and_scales_them_by_the_calibration():
    rows = {
        "native": [dict(seconds_per_update=0.5, dtype_policy="mixed_bfloat16", timed_updates=[72, 214])],
        "avx2": [dict(seconds_per_update=1.5, dtype_policy="float32", timed_updates=[72, 214])],
    }
    args = recipe_time.argparse.Namespace(trial="mini_12k")
    calibration = dict(real_avx2_tokens_per_sec=1000.0, emulated_tokens_per_sec=1500.0, emulated_over_real=1.5)
    out = recipe_time.summary(args, rows, {"mini_12k": 12000, "published": 8000}, calibration)
    assert out["avx2_over_native"] == 3.0
    assert out["settings"]["native"]["run_hours"] == {"mini_12k": pytest.approx(1.67, abs=0.01), "published": 1.11}
    assert out["settings"]["avx2"]["run_hours"] == {"mini_12k": 5.0, "published": pytest.approx(3.33, abs=0.01)}
    assert out["real_avx2_run_hours"] == {"mini_12k": 7.5, "published": 5.0}
    assert out["settings"]["avx2"]["timed_updates"] == [72, 214]  # the window the seconds were measured over
    rows["avx2"].append(dict(seconds_per_update=1.5, dtype_policy="float32", timed_updates=[72, 143]))
    with pytest.raises(ValueError, match=r"the avx2 rounds timed different updates: \[\(72, 143\), \(72, 214\)\]"):
        recipe_time.summary(args, rows, {"mini_12k": 12000}, None)


def test_calibration_divides_the_emulated_throughput_by_the_real_avx2_one(tmp_path, monkeypatch):
    def results(tokens):
        return {"results": [{"name": "keras-hub fp32", "median": {"tokens": 1.0}},
                            {"name": "ours fp32", "median": {"tokens": tokens}}]}  # fmt: skip

    real = tmp_path / "train_small.json"
    real.write_text(json.dumps(results(1000.0)), encoding="utf-8")
    monkeypatch.setattr(recipe_time, "REAL_AVX2", str(real))
    seen = {}

    def fake_run(command, env, capture_output, text):
        seen.update(command=command, env=env)
        with open(command[command.index("--json") + 1], "w", encoding="utf-8") as f:
            json.dump(results(1800.0), f)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(recipe_time.subprocess, "run", fake_run)
    out = recipe_time.calibration({"ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert out == dict(real_avx2_tokens_per_sec=1000.0, emulated_tokens_per_sec=1800.0, emulated_over_real=1.8)
    assert seen["env"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"} and "--precisions" in seen["command"]
    real.write_text(json.dumps({"results": [{"name": "keras-hub fp32", "median": {"tokens": 1.0}}]}), "utf-8")
    with pytest.raises(ValueError, match=f"recipe_time: {real} has no 'ours fp32' row"):
        recipe_time.calibration({})


def test_the_worker_times_whole_epochs_and_reports_the_precision_auto_picked(tmp_path, monkeypatch, capsys):
    from keras_transformer import hardware

    tiny = dict(preset="tiny", vocab_size=400, batch_tokens=256, validate_bleu_every=None, precision="auto")
    for key, value in tiny.items():
        monkeypatch.setitem(published.RECIPE, key, value)
    # "auto" resolves to bfloat16 here whatever the CPU: the report must give the run's, not the recipe's or Keras'.
    monkeypatch.setattr(hardware, "auto_precision", lambda *args, **kwargs: ("mixed_bfloat16", "a test"))
    recipe_time.worker("published", epochs=1, output=str(tmp_path / "run"), limit=60)
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    steps = result["steps_per_epoch"]
    assert result["timed_updates"] == [steps + 1, 2 * steps + 1] and result["seconds_per_update"] > 0
    assert result["dtype_policy"] == "mixed_bfloat16"


def test_at_least_one_epoch_is_timed(capsys):
    with pytest.raises(SystemExit):
        recipe_time.main(["--epochs", "0"])
    assert "--epochs 0: time at least one epoch" in capsys.readouterr().err


def test_results_file_records_its_provenance(tmp_path, monkeypatch):
    row = dict(seconds_per_update=1.0, dtype_policy="float32", timed_updates=[72, 214])
    rows = {name: [row] for name in recipe_time.SETTINGS}
    monkeypatch.setattr(recipe_time, "measure", lambda args: rows)
    path = tmp_path / "recipe_time.json"
    recipe_time.main(["--json", str(path)])
    payload = json.loads(path.read_text(encoding="utf-8"))
    assert payload["command"].startswith("python ") and "commit" in payload and payload["cpu_flags"]
    assert payload["recipe_steps"] == {"mini_12k": 12000, "published": 8000}
    assert payload["settings"]["avx2"]["run_hours"] == {"mini_12k": 3.33, "published": 2.22}
