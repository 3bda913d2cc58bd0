"""Recipe trials for the Multi30k demo, judged on the validation split only.

A trial is `examples/train_multi30k.py` (what `make demo` runs) with its
recipe options spelled out (model, dropout, vocabulary, schedule, subword
sampling), trained in the demo's time budget into `runs/trials/NAME`, then
scored on Multi30k *val*: the trained final model, plus choices made after
training (average the last 3, 5 or 10 checkpoints, those of the final
fifth of the steps as the demo does, or keep the best-BLEU one; beam size
and length penalty). test2016 is never decoded here.

    python benchmarks/recipe_trials.py list
    python benchmarks/recipe_trials.py run small_drop0.1 mini_drop0.3   # ~30 min each on 2 cores
    python benchmarks/recipe_trials.py score demo=runs/multi30k_en_de   # a finished run, e.g. `make demo`'s
    python benchmarks/recipe_trials.py table                           # -> benchmarks/results/<cpu>/recipe_trials.json

`run` skips trials already scored; `table` collects every scored trial into
one JSON (options, steps, epochs, validation loss and BLEU, wall time,
machine) and prints it as a markdown table.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

TRIALS_DIR = os.path.join(common.ROOT, "runs", "trials")
SCORES_FILENAME = "val_trial_scores.json"

# Every trial states the whole recipe, so a trial means the same thing whatever the demo's defaults are.
# Trials before `pad_to_multiple_of` existed padded every batch to a multiple of 8 tokens.
RECIPE = dict(
    preset="small",
    vocab_size=8000,
    dropout=0.0,
    label_smoothing=0.1,
    warmup_steps=400,
    lr_scale=0.8,
    subword_sampling=0.0,
    average_last=5,
    average_fraction=None,
    pad_to_multiple_of=8,
)
TRIALS = {
    "small_drop0": dict(RECIPE),
    "small_drop0.1": dict(RECIPE, dropout=0.1),
    "mini_drop0.3": dict(RECIPE, preset="mini", dropout=0.3, warmup_steps=800, lr_scale=1.0),
    "mini_drop0.1": dict(RECIPE, preset="mini", dropout=0.1, warmup_steps=800, lr_scale=1.0),
    "mini_drop0.3_bpedrop0.1": dict(
        RECIPE, preset="mini", dropout=0.3, warmup_steps=800, lr_scale=1.0, subword_sampling=0.1
    ),
    "small_drop0.1_bpedrop0.1": dict(RECIPE, dropout=0.1, subword_sampling=0.1),
    "small_drop0.3_bpedrop0.1": dict(RECIPE, dropout=0.3, subword_sampling=0.1),
    "small_drop0.1_lr1.2": dict(RECIPE, dropout=0.1, lr_scale=1.2),
    "small_drop0.2": dict(RECIPE, dropout=0.2),
    "small_drop0.1_vocab5k": dict(RECIPE, dropout=0.1, vocab_size=5000),
    "small_drop0.1_vocab10k": dict(RECIPE, dropout=0.1, vocab_size=10000),
    "small_drop0.1_batch3k": dict(RECIPE, dropout=0.1, batch_tokens=3072),
    "small_drop0.1_cooldown0.3": dict(RECIPE, dropout=0.1, cooldown=0.3),
    "small_drop0.1_lr0.6": dict(RECIPE, dropout=0.1, lr_scale=0.6),
    "small_drop0.1_ls0.2": dict(RECIPE, dropout=0.1, label_smoothing=0.2),
    # Label smoothing 0.2 for exactly the steps of `make demo` on a 2-core AMD EPYC (1,944), however long they take.
    "small_drop0.1_ls0.2_steps1944": dict(RECIPE, dropout=0.1, label_smoothing=0.2, max_steps=1944, time_budget=60),
    # The paper's label smoothing for exactly the steps the ls0.2 `make demo` reached on a slower-running EPYC (1,710).
    "small_drop0.1_steps1710": dict(RECIPE, dropout=0.1, max_steps=1710, time_budget=60),
    # Length buckets one or two tokens apart (less padding, the same cost per step) for the 1,944 steps of
    # the EPYC's `make demo`, whose buckets were multiples of 8.
    "small_drop0.1_pad1_steps1944": dict(RECIPE, dropout=0.1, pad_to_multiple_of=1, max_steps=1944, time_budget=60),
    # The same buckets with batches of 3,500 tokens: as many real tokens per step as the demo's 4,096 padded to
    # multiples of 8, 15% fewer padded ones, so 2,278 steps cost what the demo's 1,944 did.
    "small_drop0.1_pad1_batch3500_steps2278": dict(
        RECIPE, dropout=0.1, pad_to_multiple_of=1, batch_tokens=3500, max_steps=2278, time_budget=60
    ),
    # Label smoothing 0.2 in the time budget once the exact dropout (836f968) made steps ~8% cheaper: the
    # budget's steps on the EPYC went from 1,944 to 2,093, past the 1,944 of `small_drop0.1_ls0.2_steps1944`.
    "small_drop0.1_ls0.2_exact_dropout": dict(RECIPE, dropout=0.1, label_smoothing=0.2),
    # Pre-LN (Xiong et al., 2020: x + Sublayer(LayerNorm(x)), a final LayerNorm per stack) trains stably at a
    # higher learning rate and converges faster early on, which is where a 27.5-minute budget ends: twice the
    # demo's peak learning rate.
    "small_drop0.1_preln_lr1.6": dict(RECIPE, dropout=0.1, norm_first=True, lr_scale=1.6),
    # The demo's recipe averaging its last 20 checkpoints (every 50 steps: the last ~950 steps) instead of 10;
    # the scores also give the averages of the last 5, 10 and 15 of the same run.
    "small_drop0.1_average20": dict(RECIPE, dropout=0.1, average_last=20),
    # The demo's recipe and code with another seed (initial weights, dropout masks, data order): how far apart
    # two runs of one recipe land, to read the differences between trials by.
    "small_drop0.1_average10_seed1": dict(RECIPE, dropout=0.1, average_last=10, seed=1),
    # Trained and scored on lower-cased text, as the Multi30k papers' models are (their data is the lower-cased
    # tokenized release): lower-cased tokenized BLEU then no longer asks the model to get German case right.
    # Not a demo option (its output would be lower-cased); `lowercase` is the trial's own: see `trial_command`.
    "small_drop0.1_average10_lowercase": dict(RECIPE, dropout=0.1, average_last=10, lowercase=True),
    # The demo's recipe (final-fifth average) without dropout, for CPUs without AVX512_BF16: their budget buys ~6
    # epochs (~830 steps), half the 12 after which dropout 0 overfit on AVX512_BF16, and no dropout masks to draw.
    "small_drop0_final_fifth": dict(RECIPE, dropout=0.0, average_last=10, average_fraction=0.2),
    # The demo's recipe with more dropout, for CPUs whose budget buys ~29 epochs (~4,000 steps: a 2-core Zen 5
    # EPYC in native bfloat16), twice the ~15 for which dropout 0.1 was chosen. There `make demo` with 0.1
    # overfit: validation loss bottomed after 16 epochs and greedy validation BLEU after 18.
    "small_drop0.2_final_fifth": dict(RECIPE, dropout=0.2, average_last=10, average_fraction=0.2),
    "small_drop0.3_final_fifth": dict(RECIPE, dropout=0.3, average_last=10, average_fraction=0.2),
    # Dropout 0.2 with another seed (initial weights, dropout masks, data order): whether its lead over 0.1 on a
    # ~29-epoch run is more than the spread of two runs.
    "small_drop0.2_final_fifth_seed1": dict(RECIPE, dropout=0.2, average_last=10, average_fraction=0.2, seed=1),
    # Where the budget buys ~29 epochs of `small`, spend some of it on depth: 4+4 layers (~1.3x the step's cost,
    # ~22 epochs), with dropout 0.2 for the larger model.
    "small_4layers_drop0.2_final_fifth": dict(RECIPE, num_layers=4, dropout=0.2, average_last=10, average_fraction=0.2),
    # Where the budget buys ~29 epochs, regularize with BPE-dropout (Provilkov et al., 2020: p = 0.1) instead of
    # more dropout: each pass segments the sentences anew. On a ~6-epoch budget it fell far behind early
    # (`small_drop0.1_bpedrop0.1`); with five times the epochs it has time to pay off, as in its paper.
    "small_drop0.1_bpedrop0.1_final_fifth": dict(
        RECIPE, dropout=0.1, subword_sampling=0.1, average_last=10, average_fraction=0.2
    ),
    # Larger batches than the demo's 4,096 tokens: smaller batches (3,072) scored lower with more steps
    # (`small_drop0.1_batch3k`), and Transformer-tiny trains with ~8k-token batches. 6,144 tokens take ~1.5x the
    # step's time, so the budget buys ~2/3 of the steps with the same epochs and less gradient noise.
    "small_drop0.1_batch6k_final_fifth": dict(
        RECIPE, dropout=0.1, batch_tokens=6144, average_last=10, average_fraction=0.2
    ),
    # An exponential moving average of the weights, updated every step (Keras' optimizer option `use_ema`),
    # instead of averaging the final fifth's checkpoints. Decay 0.996: its weights' mean age, 250 steps, is that of
    # the demo's average of 10 checkpoints 50 steps apart; averages reaching further back scored lower
    # (`small_drop0.1_average20`).
    "small_drop0.1_ema0.996": dict(RECIPE, dropout=0.1, average_last=1, ema=0.996),
    # The same with another seed: whether its lead over the demo's checkpoint average outlasts the seed's spread.
    "small_drop0.1_ema0.996_seed1": dict(RECIPE, dropout=0.1, average_last=1, ema=0.996, seed=1),
    # Transformer-tiny's batches and peak rate on its shape: ~8k-token batches and a peak of ~5e-3 (lr scale 1.6
    # with warmup 800: 1.6 * 128^-0.5 * 800^-0.5), with dropout 0.1 for the ~32 epochs the budget buys (its 0.3
    # is for 130), the final fifth averaged.
    "mini_drop0.1_batch8k_lr1.6_final_fifth": dict(
        RECIPE,
        preset="mini",
        dropout=0.1,
        batch_tokens=8192,
        warmup_steps=800,
        lr_scale=1.6,
        average_last=10,
        average_fraction=0.2,
    ),
    # The demo's recipe (dropout 0.1, the final fifth averaged) with whole batches that no longer leave out a
    # length bucket holding fewer pairs than one batch (commit 4b3db49): on Multi30k 489 pairs, 423 of them of at
    # most 7 pieces, were never trained on; an epoch is 144 batches instead of 139.
    "small_drop0.1_final_fifth_whole_batches": dict(RECIPE, dropout=0.1, average_last=10, average_fraction=0.2),
    # The same with another seed (initial weights, dropout masks, data order): whether its lead over the recipe
    # before the change outlasts the seed's spread (two seeds of that recipe landed 1.1 apart on validation).
    "small_drop0.1_final_fifth_whole_batches_seed1": dict(
        RECIPE, dropout=0.1, average_last=10, average_fraction=0.2, seed=1
    ),
}
# Where `lowercase` trials read their lower-cased copy of the shipped Multi30k (`lowercased_multi30k`).
LOWERCASED_DIR = os.path.join(TRIALS_DIR, "lowercased_multi30k")
# What every trial also does: keep at least 10 checkpoints (to compare averaging 5, 10 and, where a trial keeps
# more, 15 and 20) and the best-BLEU one.
TRIAL_FLAGS = [
    "--eval-split",
    "val",
    "--no-export",
    "--keep-checkpoints",
    "10",
    "--validate-bleu-every",
    "500",
    "--keep-best",
]
# Decoding choices tried on each trial's final model (§6.1: beam 4, alpha 0.6).
SEARCHES = [(4, 0.6), (5, 0.6), (4, 1.0), (5, 1.0), (8, 1.0)]


def recipe_flags(recipe):
    flags = []
    for key, value in recipe.items():
        if key == "lowercase":  # the trial's data, not a demo option (`trial_command`)
            continue
        flag = key.replace("_", "-")
        if isinstance(value, bool):  # the demo's on/off options: --norm-first / --no-norm-first
            flags.append(("--" if value else "--no-") + flag)
        elif value is None:
            flags += ["--" + flag, "none"]
        else:
            flags += ["--" + flag, str(value)]
    return flags


def trial_command(name):
    """The demo command of trial `name` (relative paths: run it from the repository root)."""
    data = []
    if TRIALS[name].get("lowercase"):
        data_dir = os.path.relpath(LOWERCASED_DIR, common.ROOT)
        data = ["--data", f"files:{data_dir}/{{split}}.{{src}},{data_dir}/{{split}}.{{tgt}}"]
    return [
        "examples/train_multi30k.py",
        "--output",
        os.path.join("runs", "trials", name),
        *TRIAL_FLAGS,
        *data,
        *recipe_flags(TRIALS[name]),
    ]


def lowercased_multi30k():
    """Writes the shipped Multi30k train/val/test2016 lower-cased (`str.lower`) into `LOWERCASED_DIR`."""
    from keras_transformer.data.corpora import read_lines

    os.makedirs(LOWERCASED_DIR, exist_ok=True)
    for split in ("train", "val", "test2016"):
        for lang in ("en", "de"):
            with open(os.path.join(LOWERCASED_DIR, f"{split}.{lang}"), "w", encoding="utf-8") as f:
                f.write("".join(line.lower() + "\n" for line in read_lines(split, lang)))


def train_trial(name):
    """Trains trial `name` with the demo script; returns its wall time in seconds and its command."""
    output = os.path.join(TRIALS_DIR, name)
    if TRIALS[name].get("lowercase"):
        lowercased_multi30k()
    command = trial_command(name)
    common.log("python " + " ".join(command))
    started = time.perf_counter()
    with open(output + ".log", "a", encoding="utf-8") as log_file:
        subprocess.run(
            [sys.executable, *command], check=True, stdout=log_file, stderr=subprocess.STDOUT, cwd=common.ROOT
        )
    return time.perf_counter() - started, "python " + " ".join(command)


def _translate_val(model, tokenizer, beam, alpha, lowercase=False):
    """Scores val; `lowercase`: the model was trained on lower-cased text, so it gets lower-cased sources
    (the tokenized BLEU lower-cases both sides anyway; the cased scores then mean little)."""
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.inference.evaluation import corpus_scores
    from keras_transformer.inference.translator import Translator

    sources, references = read_lines("val", "en"), read_lines("val", "de")
    if lowercase:
        sources = [line.lower() for line in sources]
    started = time.perf_counter()
    hypotheses = Translator(model, tokenizer, beam_size=beam, alpha=alpha).translate(sources)
    scores = corpus_scores(hypotheses, references, lang="de")
    return dict(
        beam=beam,
        alpha=alpha,
        bleu=round(scores["bleu"], 2),
        tok_bleu=round(scores["tok_bleu"], 2),
        chrf=round(scores["chrf"], 2),
        decode_seconds=round(time.perf_counter() - started, 1),
    )


def score_variants(run_dir, only_final=False, lowercase=False):
    """Validation BLEU of the final model under each search, and of the other weight choices at beam 4.

    `only_final`: just the final model (the latest checkpoint of a stopped run) at beam 4, alpha 0.6.
    `lowercase`: a model trained on lower-cased text (see `_translate_val`).
    """
    from keras_transformer.run_dir import list_checkpoints, load_run
    from keras_transformer.training.averaging import average_checkpoints, checkpoints_to_average

    model, tokenizer = load_run(run_dir, dtype="float32")
    final_weights = model.get_weights()
    searches = SEARCHES[:1] if only_final else SEARCHES
    variants = {"final": [_translate_val(model, tokenizer, beam, alpha, lowercase) for beam, alpha in searches]}
    if only_final:
        return variants
    steps_and_paths = list_checkpoints(run_dir)
    checkpoints = [path for _, path in steps_and_paths]
    choices = {"last": checkpoints[-1:], "average_last_3": checkpoints[-3:], "average_last_5": checkpoints[-5:]}
    for count in (10, 15, 20):
        if len(checkpoints) >= count:
            choices[f"average_last_{count}"] = checkpoints[-count:]
    # The demo's rule (`--average-fraction 0.2 --average-last 10`): those of the final fifth of the steps, at most 10.
    choices["average_final_fifth"] = checkpoints_to_average(steps_and_paths, steps_and_paths[-1][0], 10, 0.2)
    best = os.path.join(run_dir, "checkpoints", "best.weights.h5")
    for choice, paths in choices.items():
        model.set_weights(average_checkpoints(paths, model))
        variants[choice] = [_translate_val(model, tokenizer, 4, 0.6, lowercase)]
    if os.path.exists(best):
        model.set_weights(final_weights)
        model.load_weights(best)
        variants["best_val_bleu_checkpoint"] = [_translate_val(model, tokenizer, 4, 0.6, lowercase)]
    return variants


def summarize(name, run_dir, wall_seconds=None, command=None, only_final=False):
    """One trial's row: its options, how far it trained and how it scores on validation."""
    from keras_transformer.run_dir import read_csv

    with open(os.path.join(run_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    history = read_csv(os.path.join(run_dir, "history.csv"))
    bleu = read_csv(os.path.join(run_dir, "bleu.csv"))
    # The demo script's report: train time, speed and the final model's validation loss, whatever split it scored.
    report = {}
    for split in ("val", "test2016"):
        path = os.path.join(run_dir, f"{split}_scores.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                report = {
                    k: v
                    for k, v in json.load(f).items()
                    if k in ("train_seconds", "tokens_per_sec", "val_metrics", "step")
                }
            break
    steps_per_epoch = config["data"]["steps_per_epoch"]
    val_losses = [
        (int(r["step"]), round(float(r["val_loss"]), 4)) for r in history if r.get("val_loss") not in (None, "", "NA")
    ]
    step = int(history[-1]["step"]) if history else None
    return dict(
        name=name,
        run_dir=os.path.relpath(run_dir, common.ROOT),
        command=command,
        recipe=TRIALS.get(name),
        model=config["model"],
        precision=config.get("precision"),
        training={
            k: config["training"].get(k)
            for k in (
                "batch_tokens",
                "time_budget",
                "warmup_steps",
                "lr_scale",
                "subword_sampling",
                "average_last",
                "average_fraction",
                "vocab_size",
                "seed",
                "pad_to_multiple_of",
            )
        },
        steps=step,
        epochs=round(step / steps_per_epoch, 2) if step else None,
        train_seconds=report.get("train_seconds"),
        wall_seconds=round(wall_seconds, 1) if wall_seconds else None,
        tokens_per_sec=report.get("tokens_per_sec"),
        final_val_loss=(report.get("val_metrics") or {}).get("loss"),
        val_loss_per_epoch=val_losses,
        best_epoch_val_loss=min((v for _, v in val_losses), default=None),
        tokens_per_sec_per_epoch=[round(float(r["tokens_per_sec"])) for r in history if r.get("tokens_per_sec")],
        val_bleu_during_training=[(int(r["step"]), float(r["bleu"])) for r in bleu if r.get("bleu")],
        variants=score_variants(run_dir, only_final, lowercase=bool((TRIALS.get(name) or {}).get("lowercase"))),
    )


def score(name, run_dir, wall_seconds=None, command=None, only_final=False):
    row = summarize(name, run_dir, wall_seconds, command, only_final)
    row["scored"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    row["machine"] = common.machine_info()
    row["cpu_flags"] = common.cpu_flags()
    # Beside the trials (where `table` looks), also for a run trained elsewhere (`score demo=RUN_DIR`).
    os.makedirs(os.path.join(TRIALS_DIR, name), exist_ok=True)
    with open(os.path.join(TRIALS_DIR, name, SCORES_FILENAME), "w", encoding="utf-8") as f:
        json.dump(row, f, indent=2)
    final = row["variants"]["final"][0]
    common.log(
        f"{name}: {row['steps']} steps ({row['epochs']} epochs), val loss {row['final_val_loss']}, "
        f"val BLEU {final['bleu']} / tokenized {final['tok_bleu']}"
    )
    return row


def _previous_rows(path):
    """The rows of an earlier table at `path`, by trial name: a new table keeps their notes, and the rows of
    trials whose run directories are not on this machine (trials of earlier sessions)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {row["name"]: row for row in json.load(f)["trials"]}


def table(rows):
    headers = [
        "trial",
        "steps",
        "epochs",
        "train min",
        "val loss",
        "val BLEU",
        "val tok BLEU",
        "avg10 tok",
        "best-ckpt tok",
        "best search (tok)",
    ]
    lines = []
    for row in rows:
        v = row["variants"]
        best_search = max(v["final"], key=lambda s: s["tok_bleu"])
        lines.append(
            [
                row["name"],
                row["steps"],
                row["epochs"],
                round((row["train_seconds"] or 0) / 60, 1),
                row["final_val_loss"] and round(row["final_val_loss"], 3),
                v["final"][0]["bleu"],
                v["final"][0]["tok_bleu"],
                v.get("average_last_10", [{}])[0].get("tok_bleu", "-"),
                v.get("best_val_bleu_checkpoint", [{}])[0].get("tok_bleu", "-"),
                f"beam {best_search['beam']} alpha {best_search['alpha']}: {best_search['tok_bleu']}",
            ]
        )
    return common.markdown_table(headers, lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    sub = parser.add_subparsers(dest="action", required=True)
    sub.add_parser("list", help="the trials and their recipes")
    run = sub.add_parser("run", help="train and score trials (skips scored ones)")
    run.add_argument("names", nargs="+", choices=sorted(TRIALS))
    scored = sub.add_parser("score", help="score finished run directories on validation")
    scored.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR")
    scored.add_argument("--command", help="how the run was made (default: the trial's command, for a trial name)")
    scored.add_argument(
        "--only-final", action="store_true", help="score only the final weights at beam 4 (e.g. a trial stopped early)"
    )
    out = sub.add_parser("table", help="collect the scored trials into one JSON")
    out.add_argument("--json", default=None, help="default benchmarks/results/<cpu>/recipe_trials.json")
    out.add_argument("--trials-dir", default=TRIALS_DIR, help="where the trials are (default %(default)s)")
    out.add_argument(
        "--note",
        action="append",
        default=[],
        metavar="NAME=TEXT",
        help="a remark recorded with a trial, e.g. that it was stopped early",
    )
    args = parser.parse_args(argv)
    common.quiet_tensorflow()

    if args.action == "list":
        for name in TRIALS:
            # What follows the script, --output DIR and the flags every trial shares.
            print(f"{name}: {' '.join(trial_command(name)[3 + len(TRIAL_FLAGS) :])}")
    elif args.action == "run":
        for name in args.names:
            run_dir = os.path.join(TRIALS_DIR, name)
            if os.path.exists(os.path.join(run_dir, SCORES_FILENAME)):
                common.log(f"{name}: already scored, skipped")
                continue
            os.makedirs(TRIALS_DIR, exist_ok=True)
            wall, command = train_trial(name)
            score(name, run_dir, wall, command)
    elif args.action == "score":
        for item in args.runs:
            name, _, run_dir = item.partition("=")
            command = args.command or ("python " + " ".join(trial_command(name)) if name in TRIALS else None)
            score(name, run_dir, command=command, only_final=args.only_final)
    else:
        target = args.json or os.path.join(
            common.ROOT, "benchmarks", "results", common.results_folder(), "recipe_trials.json"
        )
        previous = _previous_rows(target)
        notes = {name: row["note"] for name, row in previous.items() if row.get("note")}
        notes.update(item.partition("=")[::2] for item in args.note)
        found = {}
        for name in sorted(os.listdir(args.trials_dir)):
            path = os.path.join(args.trials_dir, name, SCORES_FILENAME)
            if os.path.exists(path):
                with open(path, encoding="utf-8") as f:
                    found[name] = json.load(f)
                if "tokens_per_sec_per_epoch" not in found[name]:  # rows scored before the field existed
                    from keras_transformer.run_dir import read_csv

                    history = read_csv(os.path.join(args.trials_dir, name, "history.csv"))
                    found[name]["tokens_per_sec_per_epoch"] = [round(float(r["tokens_per_sec"])) for r in history]
        rows = [found.get(name) or previous[name] for name in sorted(set(previous) | set(found))]
        for row in rows:
            if row["name"] in notes:
                row["note"] = notes[row["name"]]
        payload = dict(
            versions=common.package_versions(["keras-transformer", "tensorflow", "keras", "sacrebleu"]),
            note="validation split only (Multi30k val, 1,014 sentences); test2016 is never decoded here",
            trials=rows,
        )
        common.write_json(target, payload)
        print(table(rows))


if __name__ == "__main__":
    main()
