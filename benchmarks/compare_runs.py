"""Compare finished Multi30k demo runs: validation curves per epoch and test2016 scores, in one JSON.

Each run directory is one written by `examples/train_multi30k.py` (or `make
demo`): `history.csv` (validation loss and accuracy per epoch),
`test2016.hyp.de` (the test2016 translations) and `test2016_scores.json`. The
translations are scored again here with the current metrics
(`keras_transformer.inference.evaluation.corpus_scores`), so runs made by
different versions are compared on the same definitions.

    python benchmarks/compare_runs.py before=RUN_A after=RUN_B \\
        --json benchmarks/results/avx512_bf16/init_fix_demo.json
"""

import argparse
import csv
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

from keras_transformer.data.corpora import read_lines  # noqa: E402
from keras_transformer.inference.evaluation import corpus_scores  # noqa: E402


def read_run(run_dir, split="test2016"):
    with open(os.path.join(run_dir, "history.csv"), newline="", encoding="utf-8") as f:
        history = list(csv.DictReader(f))
    with open(os.path.join(run_dir, f"{split}.hyp.de"), encoding="utf-8") as f:
        hypotheses = f.read().split("\n")[:-1]
    with open(os.path.join(run_dir, f"{split}_scores.json"), encoding="utf-8") as f:
        report = json.load(f)
    scores = corpus_scores(hypotheses, read_lines(split, "de"), lang="de")
    return {
        "run_dir": os.path.abspath(run_dir),
        "steps": report["step"],
        "train_seconds": report.get("train_seconds"),
        "tokens_per_sec": report.get("tokens_per_sec"),
        "final_val_loss": report.get("val_metrics", {}).get("loss"),
        "val_loss_per_epoch": [(int(r["step"]), round(float(r["val_loss"]), 4)) for r in history if r.get("val_loss")],
        "test2016": {key: scores[key] for key in ("bleu", "tok_bleu", "chrf", "bleu_signature", "tok_bleu_signature")},
        "test2016_as_reported_by_the_run": {key: report.get(key) for key in ("bleu", "tok_bleu", "chrf")},
        # What the demo (examples/train_multi30k.py) records about itself, where the run has it.
        **{
            key: report[key]
            for key in (
                "command",
                "epochs",
                "decode_seconds",
                "wall_seconds",
                "peak_rss_mb",
                "best_val_bleu",
                "machine",
                "training",
            )
            if key in report
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    parser.add_argument("--json", help="write the comparison here")
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="how a run was made (its command and commit), recorded with it",
    )
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, _, path = item.partition("=")
        runs[name] = read_run(path)
    for item in args.note:
        name, _, text = item.partition("=")
        runs[name]["how"] = text
    # common.write_json adds the command, the date, the CPU flags and the load.
    payload = {
        "machine": common.machine_info(),
        "versions": common.package_versions(["keras-transformer", "tensorflow", "keras", "sacrebleu", "sacremoses"]),
        "runs": runs,
    }
    for name, run in runs.items():
        print(
            f"{name}: {run['steps']} steps, final val loss {run['final_val_loss']:.4f}, test2016 "
            f"BLEU {run['test2016']['bleu']:.2f} / tokenized {run['test2016']['tok_bleu']:.2f} / "
            f"chrF {run['test2016']['chrf']:.2f}"
        )
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
