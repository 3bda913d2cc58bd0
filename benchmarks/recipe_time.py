"""How long a Multi30k recipe trains on a CPU without AVX512_BF16, measured here with oneDNN capped at AVX2.

Issue 52 asks how long the reproduction's and the long recipe's runs take on a CPU without native bfloat16. On
such a CPU TensorFlow leaves its oneDNN rewrites off (`TF_ENABLE_ONEDNN_OPTS` defaults to 1 only with
AVX512_VNNI, AVX512_BF16 or AMX) and the library's `precision="auto"` trains in float32. This script emulates
that CPU on this one: its `avx2` setting runs a worker with `ONEDNN_MAX_CPU_ISA=AVX2` (oneDNN's own kernels,
including the matmuls Eigen hands to it, use at most AVX2) and `TF_ENABLE_ONEDNN_OPTS=0`, so `precision="auto"`
picks float32 (`keras_transformer.hardware`); its `native` setting runs the same worker as this CPU runs it.

Each worker trains the recipe (`examples/long_multi30k.py`'s trial, default the chosen one) from scratch on the
real data in a scratch run directory, exactly as a run does (epoch checkpoints and validation loss included), for
`--updates` updates, and reports seconds per update over the updates after `--skip` (tracing excluded, epoch-end
validation and checkpoints included). A run of `max_steps` updates then takes about seconds per update x
`max_steps` (the greedy validation BLEU every 1,000 updates and the final averaging and search add a few minutes).

`--calibrate` also measures `train_throughput.py --only ours --precisions fp32` (the small model, float32) under
the `avx2` setting and compares it with the same benchmark's committed figure from a real AVX2-only EPYC
(`benchmarks/results/amd_epyc_avx2/train_small.json`): their ratio scales the emulated hours to that CPU.

Usage:
    .venv/bin/python benchmarks/recipe_time.py --calibrate \\
        --json benchmarks/results/amd_epyc_zen5/recipe_time_avx2.json
    .venv/bin/python benchmarks/recipe_time.py --updates 12 --skip 4 --limit 200     # a smoke test, ~1 min
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


def seconds_per_update(marks, skip):
    """Mean seconds per update over `marks` ((update, time) at each batch end) after update `skip`."""
    kept = [(step, seconds) for step, seconds in marks if step >= skip]
    if len(kept) < 2:
        raise ValueError(f"recipe_time: {len(kept)} updates after --skip {skip}; train more (--updates)")
    (first_step, first), (last_step, last) = kept[0], kept[-1]
    return (last - first) / (last_step - first_step)


def worker(trial, updates, skip, output, limit):
    """Trains `updates` updates of `trial` in `output`; prints its seconds per update as a JSON line."""
    import dataclasses

    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import keras
    import long_multi30k
    import reproduce_multi30k as published

    from keras_transformer import training

    recipe = {**published.LEGACY_RECIPE, **long_multi30k.trial_recipe(trial)}
    args = published.training_args(0, output, limit, recipe)
    args = dataclasses.replace(args, max_steps=updates)
    marks = []

    class Marks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            marks.append((int(self.model.optimizer.iterations.numpy()), time.perf_counter()))

    training.train(args, callbacks=[Marks()])
    result = dict(
        seconds_per_update=seconds_per_update(marks, skip),
        updates=marks[-1][0],
        dtype_policy=_read_json(os.path.join(output, "config.json"))["precision"],  # what "auto" picked
        steps_per_epoch=args.checkpoint_every,
    )
    print("\n" + json.dumps(result))  # after the progress bar's last line


def _read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def calibration(env):
    """`train_throughput.py`'s float32 small model under `env`, against the committed real-AVX2 figure."""
    with open(REAL_AVX2, encoding="utf-8") as f:
        real = next(row for row in json.load(f)["results"] if row["name"] == "ours fp32")["median"]["tokens"]
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "train.json")
        command = [sys.executable, os.path.join(HERE, "train_throughput.py"), "--only", "ours", "--precisions",
                   "fp32", "--json", path]  # fmt: skip
        completed = subprocess.run(command, env=env, capture_output=True, text=True)
        if completed.returncode != 0:
            raise RuntimeError(f"train_throughput.py failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
        with open(path, encoding="utf-8") as f:
            emulated = next(row for row in json.load(f)["results"] if row["name"] == "ours fp32")["median"]["tokens"]
    return dict(real_avx2_tokens_per_sec=real, emulated_tokens_per_sec=emulated, emulated_over_real=emulated / real)


def measure(args):
    """One worker per setting and round, alternating; medians per setting."""
    rows = {name: [] for name in SETTINGS}
    for round_ in range(args.repeats):
        for name, extra in SETTINGS.items():
            env = dict(os.environ, **extra)
            with tempfile.TemporaryDirectory() as scratch:
                command = [sys.executable, __file__, "--worker", "--trial", args.trial, "--updates", str(args.updates),
                           "--skip", str(args.skip), "--output", os.path.join(scratch, "run")]  # fmt: skip
                if args.limit:
                    command += ["--limit", str(args.limit)]
                common.log(f"round {round_ + 1}/{args.repeats}: {name}")
                rows[name].append(common.json_from_process(command, f"{name} worker", env=env))
    return rows


def summary(args, rows, max_steps, calibrated):
    """Per setting: median seconds per update and the hours of a `max_steps` run; the ratio avx2 / native."""
    settings = {}
    for name, results in rows.items():
        seconds = common.median([row["seconds_per_update"] for row in results])
        settings[name] = dict(
            env=SETTINGS[name],
            dtype_policy=results[0]["dtype_policy"],
            seconds_per_update=[round(row["seconds_per_update"], 4) for row in results],
            median_seconds_per_update=round(seconds, 4),
            run_hours=round(seconds * max_steps / 3600, 2),
        )
    ratio = settings["avx2"]["median_seconds_per_update"] / settings["native"]["median_seconds_per_update"]
    out = dict(trial=args.trial, max_steps=max_steps, settings=settings, avx2_over_native=round(ratio, 2))
    if calibrated:
        out["calibration"] = calibrated
        out["real_avx2_run_hours"] = round(settings["avx2"]["run_hours"] * calibrated["emulated_over_real"], 2)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trial", default=None, help="a trial of examples/long_multi30k.py (default: the chosen)")
    parser.add_argument("--updates", type=int, default=300, help="updates each worker trains (default 300)")
    parser.add_argument("--skip", type=int, default=50, help="updates left out of the timing (default 50)")
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
    if args.skip >= args.updates:
        parser.error(f"--skip {args.skip} leaves no update of --updates {args.updates} to time")
    if args.worker:
        worker(args.trial, args.updates, args.skip, args.output, args.limit)
        return 0
    machine = common.machine_info()
    rows = measure(args)
    calibrated = calibration(dict(os.environ, **SETTINGS["avx2"])) if args.calibrate else None
    result = summary(args, rows, long_multi30k.trial_recipe(args.trial)["max_steps"], calibrated)
    print(json.dumps(result, indent=2))
    if args.json:
        machine["load_average_at_end"] = common.load_average()
        versions = common.package_versions(["tensorflow", "keras", "keras-transformer"])
        payload = dict(benchmark="recipe_time", machine=machine, versions=versions, args=vars(args), **result)
        common.write_json(args.json, payload)  # with its command, commit, date and CPU flags
    return 0


if __name__ == "__main__":
    sys.exit(main())
