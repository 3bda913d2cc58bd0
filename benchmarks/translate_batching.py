"""How `Translator.translate` should batch: sentences per decoding call, on this CPU.

`keras-transformer translate` and `evaluate`, the demo's test2016 scoring and
validation BLEU all call `translate(sentences, batch_size=B, workers=2)`: it
sorts the sentences by length, cuts them into even batches of at most B and
keeps two in flight. This script times that call on Multi30k test2016 (1,000
sentences, beam 4, alpha 0.6) through the run exported as a SavedModel
(`--precision`, default float32) or, with `--source run_dir`, through the run
directory itself (the in-process `Translator`, in the final model's float32),
for each batch size, each in a fresh process
(`serving_worker.py translator`, with TensorFlow's thread pools as the command
line sets them, `cli.threads`; `--threads default,cli` also times TensorFlow's
own pools): the first call (`cold`, what one `translate` command
waits for after loading the model) and a second one (`warm`, a long-lived
process). Where TensorFlow leaves its oneDNN kernels off by default, each
batch size is also timed with `TF_ENABLE_ONEDNN_OPTS=1`. Rounds alternate the
candidates; medians over the rounds, and each candidate's median ratio to the
first batch size with TensorFlow's default kernels (the baseline). Every
candidate's translations are compared with the baseline's.

    .venv/bin/python benchmarks/translate_batching.py runs/multi30k_en_de \\
        --json benchmarks/results/amd_epyc_avx2/translate_batching.json
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import decode_serving  # noqa: E402

common.quiet_tensorflow()

# Translator.translate's batches in flight, as the command line runs it.
from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_WORKERS as WORKERS  # noqa: E402

DEFAULT_BATCH_SIZES = "64,128,256,512"


def candidates(batch_sizes, onednn_by_default, threads=("cli",)):
    kernels = ("default",) if onednn_by_default else ("default", "onednn")
    return [(size, kernel, pools) for pools in threads for kernel in kernels for size in batch_sizes]


def label(candidate):
    size, kernels, pools = candidate
    # The command line's pools (the default) are not named, so labels read as they did before the option.
    pools_label = ", TensorFlow's default thread pools" if pools == "default" else ""
    return f"batch_size {size}, {kernels} kernels{pools_label}"


def time_once(candidate, model, sentences_file, output_path):
    """Cold and warm seconds of one fresh process, and its translations (written to `output_path`)."""
    size, kernels, pools = candidate
    worker = decode_serving.Worker(["translator", model, size, WORKERS, kernels, pools], sentences_file)
    try:
        cold = worker.ready["warmup_seconds"]
        warm = worker.command("run")["seconds"]
        worker.command("translations", output_path)
    finally:
        worker.close()
    with open(output_path, encoding="utf-8") as f:
        return cold, warm, f.read().split("\n")[:-1]


def summarize(times, outputs, baseline, count):
    results = {}
    for candidate, runs in times.items():
        entry = {}
        for phase in ("cold", "warm"):
            seconds = [run[phase] for run in runs]
            ratios = [base[phase] / run[phase] for base, run in zip(times[baseline], runs)]
            entry[phase] = {
                "sentences_per_second": common.median([count / s for s in seconds]),
                "seconds": seconds,
                "median_ratio_to_baseline": common.median(ratios),
            }
        entry["identical_to_baseline"] = round(
            sum(a == b for a, b in zip(outputs[candidate], outputs[baseline])) / count, 3
        )
        results[label(candidate)] = entry
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/multi30k_en_de")
    parser.add_argument(
        "--batch-sizes",
        default=DEFAULT_BATCH_SIZES,
        help="comma-separated; the first is the baseline (default %(default)s)",
    )
    parser.add_argument(
        "--source",
        choices=("export", "run_dir"),
        default="export",
        help="translate through a SavedModel export of the run (default) or the run directory",
    )
    parser.add_argument("--precision", default="float32", help="the export's precision (default %(default)s)")
    parser.add_argument(
        "--threads",
        default="cli",
        help="TensorFlow's thread pools to time, comma-separated: cli (as the command line sets "
        "them) and/or default (TensorFlow's own); the first is the baseline's "
        "(default %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    batch_sizes = [int(size) for size in args.batch_sizes.split(",")]
    threads = tuple(name.strip() for name in args.threads.split(","))
    if not threads or not set(threads) <= {"cli", "default"}:
        parser.error(f"--threads takes cli and/or default, got {args.threads!r}")

    from keras_transformer.data import corpora
    from keras_transformer.inference.evaluation import corpus_scores
    from keras_transformer.inference.saved_model import export_saved_model

    machine = common.machine_info()
    sources, references = corpora.read_lines("test2016", "en"), corpora.read_lines("test2016", "de")
    tried = candidates(batch_sizes, decode_serving.tensorflow_uses_onednn_by_default(), threads)
    baseline = tried[0]
    times, outputs = {c: [] for c in tried}, {}
    with tempfile.TemporaryDirectory(prefix="translate_batching_") as work_dir:
        sentences_file = decode_serving.write_sentences_file(work_dir, sources)
        model = (
            args.run_dir
            if args.source == "run_dir"
            else export_saved_model(
                args.run_dir,
                os.path.join(work_dir, "export"),
                version=1,
                beam_size=decode_serving.BEAM_SIZE,
                alpha=decode_serving.ALPHA,
                dtype=args.precision,
            )
        )
        for round_index in range(args.rounds):
            for candidate in tried:
                cold, warm, outputs[candidate] = time_once(
                    candidate, model, sentences_file, os.path.join(work_dir, "out.de")
                )
                times[candidate].append({"cold": cold, "warm": warm})
                common.log(
                    f"[round {round_index + 1}/{args.rounds}] {label(candidate)}: cold {cold:.2f} s, warm {warm:.2f} s"
                )
    results = summarize(times, outputs, baseline, len(sources))
    for candidate in tried:
        results[label(candidate)]["tok_bleu"] = round(corpus_scores(outputs[candidate], references)["tok_bleu"], 2)
    rows = [
        [
            name,
            *(
                common.fmt(r[phase][key], spec)
                for phase in ("cold", "warm")
                for key, spec in (("sentences_per_second", ".1f"), ("median_ratio_to_baseline", ".2f"))
            ),
            r["identical_to_baseline"],
            r["tok_bleu"],
        ]
        for name, r in results.items()
    ]
    print(
        common.markdown_table(
            ["candidate", "cold sent/s", "x base", "warm sent/s", "x base", "identical", "tok BLEU"], rows
        )
    )
    payload = {
        "benchmark": "translate_batching",
        "run_dir": args.run_dir,
        "source": args.source,
        "precision": args.precision if args.source == "export" else "float32 (the run's final model)",
        "sentences": len(sources),
        "beam_size": decode_serving.BEAM_SIZE,
        "alpha": decode_serving.ALPHA,
        "workers": WORKERS,
        "threads": list(threads),
        "rounds": args.rounds,
        "baseline": label(baseline),
        "machine": machine,
        "results": results,
        "versions": common.package_versions(["tensorflow", "tensorflow-text", "keras"]),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
