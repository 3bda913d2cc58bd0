"""What TensorFlow's oneDNN rewrites (`TF_ENABLE_ONEDNN_OPTS`) do for training and serving, on this CPU.

TensorFlow turns them on by default only on CPUs with AVX512_VNNI,
AVX512_BF16 or AMX; elsewhere it runs Eigen's kernels unless the variable is
1 when it is imported. Each round starts, for each setting (0, then 1):

* training: `train_throughput.py --only ours --precisions fp32` (the small
  model under `model.fit`, float32, the paper's dropout and label smoothing),
  its target tokens/s;
* serving: the run exported as a float32 SavedModel (beam 4, alpha 0.6),
  loaded by `serving_worker.py` (tensorflow and tensorflow_text only) and
  translating Multi30k test2016 in requests of 250, two in flight, one
  thread each: sentences/s of one timed pass after its warm-up.

Each in a fresh process with the variable set. Medians over the rounds, and
the median of each round's ratio (1 over 0).

Usage:
    .venv/bin/python benchmarks/onednn_opts.py runs/multi30k_en_de \\
        --json benchmarks/results/amd_epyc_avx2/onednn_opts.json
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
import decode_serving  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SETTINGS = ("0", "1")
SERVING = (250, 2, 1, 2)  # sentences per request, in flight, intra-op, inter-op threads


def training_tokens_per_second(setting, steps):
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "train_throughput.py"),
                "--only",
                "ours",
                "--precisions",
                "fp32",
                "--steps",
                str(steps),
                "--repeats",
                "1",
                "--no-roof",
                "--json",
                out.name,
            ],
            check=True,
            capture_output=True,
            text=True,
            env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        with open(out.name, encoding="utf-8") as f:
            return json.load(f)["results"][0]["median"]["tokens"]


def serving_sentences_per_second(setting, export_dir, sentences_file, count):
    worker = decode_serving.Worker(
        ["savedmodel", export_dir, *SERVING], sentences_file, environ={"TF_ENABLE_ONEDNN_OPTS": setting}
    )
    try:
        return count / worker.command("run")["seconds"]
    finally:
        worker.close()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/multi30k_en_de")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps per timed run")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    from keras_transformer.data import corpora
    from keras_transformer.inference.saved_model import export_saved_model

    machine = common.machine_info()
    sources = corpora.read_lines("test2016", "en")
    rates = {(part, s): [] for part in ("training", "serving") for s in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="onednn_opts_") as work_dir:
        sentences_file = decode_serving.write_sentences_file(work_dir, sources)
        export_dir = export_saved_model(
            args.run_dir,
            os.path.join(work_dir, "float32"),
            version=1,
            beam_size=decode_serving.BEAM_SIZE,
            alpha=decode_serving.ALPHA,
            dtype="float32",
        )
        for round_index in range(args.rounds):
            for setting in SETTINGS:
                rates["training", setting].append(training_tokens_per_second(setting, args.steps))
                rates["serving", setting].append(
                    serving_sentences_per_second(setting, export_dir, sentences_file, len(sources))
                )
                common.log(
                    f"[round {round_index + 1}/{args.rounds}] TF_ENABLE_ONEDNN_OPTS={setting}: "
                    f"training {rates['training', setting][-1]:,.0f} tokens/s, "
                    f"serving {rates['serving', setting][-1]:.1f} sentences/s"
                )
    results = {}
    for part, unit in (("training", "target tokens/s"), ("serving", "sentences/s")):
        off, on = rates[part, "0"], rates[part, "1"]
        results[part] = {
            "unit": unit,
            "TF_ENABLE_ONEDNN_OPTS=0": {"median": common.median(off), "runs": off},
            "TF_ENABLE_ONEDNN_OPTS=1": {"median": common.median(on), "runs": on},
            "median_ratio_1_over_0": common.median([b / a for a, b in zip(off, on)]),
        }
        print(
            f"{part}: {common.median(off):,.1f} -> {common.median(on):,.1f} {unit}, "
            f"x{results[part]['median_ratio_1_over_0']:.2f}"
        )
    payload = {
        "benchmark": "onednn_opts",
        "run_dir": args.run_dir,
        "rounds": args.rounds,
        "training_steps": args.steps,
        "serving_setting": dict(zip(("request_size", "concurrency", "intra_op_threads", "inter_op_threads"), SERVING)),
        "machine": machine,
        "results": results,
        "versions": common.package_versions(["tensorflow", "tensorflow-text", "keras"]),
        "wall_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
