"""How long a Multi30k recipe trains on an AVX2-only CPU (no AVX-512), measured here with oneDNN capped at AVX2.

Issue 52 asks how long the reproduction's and the long recipe's runs take on a CPU without native bfloat16. On an
AVX2-only CPU TensorFlow leaves its oneDNN rewrites off (`TF_ENABLE_ONEDNN_OPTS` defaults to 1 only with
AVX512_VNNI, AVX512_BF16 or AMX) and the library's `precision="auto"` trains in float32. This script emulates such
a CPU on this one: its `avx2` setting runs a worker with `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's own kernels, including
the matmuls Eigen hands to it, use at most AVX2; under this cap `precision="auto"` picks float32,
`keras_transformer.hardware`) and `TF_ENABLE_ONEDNN_OPTS=0` (Eigen's kernels, as TensorFlow runs there); its
`native` setting runs the same worker as this CPU runs it. (A CPU with AVX-512 but no AVX512_BF16 runs oneDNN with
AVX-512 and is not what this emulates.)

Each worker trains the recipe (`examples/long_multi30k.py`'s trial, default the chosen one) from scratch on the
real data in a scratch run directory, exactly as a run does (epoch checkpoints and validation loss included). It
times `--epochs` whole epochs after the first, from the first update after the first epoch's end to the last update
before the end of the last timed epoch plus one: tracing and the first validation are left out, every later
epoch's validation and checkpoint is in. A run of `max_steps` updates then takes about seconds per update x
`max_steps` (the greedy validation BLEU every 1,000 updates and the final averaging and search add a few minutes).

`--calibrate` also measures `train_throughput.py --only ours --precisions fp32` (the small model, float32) under
the `avx2` setting and compares it with the same benchmark's committed figure from a real AVX2-only EPYC
(`benchmarks/results/amd_epyc_avx2/train_small.json`): their ratio scales the emulated hours to that CPU.

Usage:
    .venv/bin/python benchmarks/recipe_time.py --calibrate \\
        --json benchmarks/results/amd_epyc_zen5/recipe_time_avx2.json
    .venv/bin/python benchmarks/recipe_time.py --epochs 1 --limit 2000     # a smoke test, a few minutes
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SETTINGS = {
    "native": {},
    "avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "TF_ENABLE_ONEDNN_OPTS": "0"},
}
REAL_AVX2 = os.path.join(HERE, "results", "amd_epyc_avx2", "train_small.json")


def seconds_per_update(marks, first, last):
    """Mean seconds per update between the batch ends of updates `first` and `last` in `marks` ((update, time))."""
    times = dict(marks)
    if first not in times or last not in times or last <= first:
        raise ValueError(f"recipe_time: no marks of updates {first} and {last} ({len(marks)} updates trained)")
    return (times[last] - times[first]) / (last - first)


def timed_window(steps_per_epoch, epochs):
    """The updates whose batch ends bound `epochs` whole epochs after the first: (first, last).

    The first epoch's end (after update `steps_per_epoch`) runs the first validation and traces it, so timing starts
    at the batch end of the update after it; `epochs` epoch ends later it stops, at the same place in the epoch.
    """
    first = steps_per_epoch + 1
    return first, first + epochs * steps_per_epoch


def worker(trial, epochs, output, limit):
    """Trains `trial` in `output` through `epochs` timed epochs; prints its seconds per update as a JSON line."""
    import dataclasses

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import keras
    import long_multi30k
    import reproduce_multi30k as published

    from keras_transformer import training

    args = published.training_args(0, output, limit, long_multi30k.trial_recipe(trial))
    first, last = timed_window(args.checkpoint_every, epochs)
    args = dataclasses.replace(args, max_steps=last)
    marks = []

    class Marks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.append((int(self.model.optimizer.iterations.numpy()), time.perf_counter()))

    training.train(args, callbacks=[Marks()])
    result = dict(
        seconds_per_update=seconds_per_update(marks, first, last),
        timed_updates=[first, last],
        dtype_policy=_read_json(os.path.join(output, "config.json"))["precision"],  # what "auto" picked
        steps_per_epoch=args.checkpoint_every,
    )
    print("\n" + json.dumps(result))  # after the progress bar's last line


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _ours_fp32_tokens(path):
    """The median tokens/s of "ours fp32" in a `train_throughput.py` results file."""
    row = next((row for row in _read_json(path)["results"] if row["name"] == "ours fp32"), None)
    if row is None:
        raise ValueError(f"recipe_time: {path} has no 'ours fp32' row")
    return row["median"]["tokens"]


def calibration(env):
    """`train_throughput.py`'s float32 small model under `env`, against the committed real-AVX2 figure."""
    real = _ours_fp32_tokens(REAL_AVX2)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "train.json")
        command = [sys.executable, os.path.join(HERE, "train_throughput.py"), "--only", "ours", "--precisions",
                   "fp32", "--json", path]  # fmt: skip
        completed = subprocess.run(command, env=env, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"train_throughput.py failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
        emulated = _ours_fp32_tokens(path)
    return dict(real_avx2_tokens_per_sec=real, emulated_tokens_per_sec=emulated, emulated_over_real=emulated / real)


def measure(args):
    """One worker per setting in each round (native, then avx2), each in a fresh process; the results per setting."""
    rows = {name: [] for name in SETTINGS}
    for round_ in range(args.repeats):
        for name, extra in SETTINGS.items():
            env = dict(os.environ, **extra)
            with tempfile.TemporaryDirectory() as scratch:
                command = [sys.executable, __file__, "--worker", "--trial", args.trial, "--epochs", str(args.epochs),
                           "--output", os.path.join(scratch, "run")]  # fmt: skip
                if args.limit:
                    command += ["--limit", str(args.limit)]
                common.log(f"round {round_ + 1}/{args.repeats}: {name}")
                rows[name].append(common.json_from_process(command, f"{name} worker", env=env))
    return rows


def _one_window(name, results):
    """The updates `[first, last]` every round of setting `name` timed (they are the same by construction)."""
    windows = {tuple(row["timed_updates"]) for row in results}
    if len(windows) != 1:
        raise ValueError(f"recipe_time: the {name} rounds timed different updates: {sorted(windows)}")
    return list(windows.pop())


def summary(args, rows, recipe_steps, calibrated):
    """Per setting: median seconds per update and the hours of each recipe's run (`recipe_steps`: name -> updates);
    the ratio avx2 / native; with `calibrated`, the hours on the real AVX2-only CPU."""
    settings, medians = {}, {}
    for name, results in rows.items():
        medians[name] = common.median([row["seconds_per_update"] for row in results])
        settings[name] = dict(
            env=SETTINGS[name],
            dtype_policy=results[0]["dtype_policy"],
            timed_updates=_one_window(name, results),
            seconds_per_update=[round(row["seconds_per_update"], 4) for row in results],
            median_seconds_per_update=round(medians[name], 4),
            run_hours={recipe: round(medians[name] * steps / 3600, 2) for recipe, steps in recipe_steps.items()},
        )
    ratio = medians["avx2"] / medians["native"]
    out = dict(trial=args.trial, recipe_steps=recipe_steps, settings=settings, avx2_over_native=round(ratio, 2))
    if calibrated:
        scale = calibrated["emulated_over_real"]
        out["calibration"] = calibrated
        out["real_avx2_run_hours"] = {
            recipe: round(medians["avx2"] * scale * steps / 3600, 2) for recipe, steps in recipe_steps.items()
        }
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trial", default=None, help="a trial of examples/long_multi30k.py (default: the chosen)")
    parser.add_argument("--epochs", type=int, default=2, help="whole epochs timed after the first (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds (default 1)")
    parser.add_argument("--limit", type=int, help="only the first N pairs of each split (a smoke test)")
    parser.add_argument("--calibrate", action="store_true", help="scale to the committed real-AVX2 throughput")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--output", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import long_multi30k

    args.trial = args.trial or long_multi30k.CHOSEN
    common.quiet_tensorflow()
    if args.epochs < 1:
        parser.error(f"--epochs {args.epochs}: time at least one epoch")
    if args.worker:
        worker(args.trial, args.epochs, args.output, args.limit)
        return 0
    machine = common.machine_info()
    rows = measure(args)
    calibrated = calibration(dict(os.environ, **SETTINGS["avx2"])) if args.calibrate else None
    steps = {name: long_multi30k.trial_recipe(name)["max_steps"] for name in dict.fromkeys([args.trial, "published"])}
    result = summary(args, rows, steps, calibrated)
    print(json.dumps(result, indent=2))
    if args.json:
        machine["load_average_at_end"] = common.load_average()
        versions = common.package_versions(["tensorflow", "keras", "keras-transformer"])
        payload = dict(benchmark="recipe_time", machine=machine, versions=versions, args=vars(args), **result)
        common.write_json(args.json, payload)  # with its command, commit, date and CPU flags
    return 0


if __name__ == "__main__":
    sys.exit(main())
