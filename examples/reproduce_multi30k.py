"""Reproduce the published "Transformer-tiny" on Multi30k en-de: Wu et al. (2021), 41.02 BLEU on test2016.

Wu, Kong, Cao, Cheung, Tang and Fu (2021), "Good for Misconceived Reasons: An
Empirical Revisiting on the Need for Visual Context in Multimodal Machine
Translation" (ACL), trained fairseq's `transformer_tiny` on Multi30k as the
text-only baseline that later Multi30k papers compare against. Their
repository (`LividWo/Revisit-MMT`, `README-baseline.md`, "Reproduce results for
Transformer-tiny") gives the command; its fork of fairseq gives the defaults
that the command leaves out. The recipe, value by value, and what this script
does for it:

Each detail as published (with its source), then what this script does:

- Data: Multi30k task 1, lower-cased, `normalize-punctuation.perl`, `tokenizer.perl` (the repository's
  `data/multi30k-en-de/*`). Here: the raw Multi30k files through the same pipeline in sacremoses
  (`moses_tokenize_lowercase`, which reproduces the official `test_2016_flickr.lc.norm.tok.de` line for line).
- Vocabulary: joint subword-nmt BPE of 10,000 merges (`data/multi30k-en-de/code`), `--joined-dictionary`: 9,708
  types + 4 specials. Here: joint SentencePiece BPE of 9,713 pieces, one more (SentencePiece, not
  subword-nmt, so the segmentation differs in detail).
- Model: `--arch transformer_tiny` (`fairseq/models/transformer.py`): 4+4 layers, d_model 128, d_ff 256, 4 heads,
  post-LN, sinusoidal positions, `--share-all-embeddings`. Here: `--preset mini`, the same shape and choices.
- Dropout: `--dropout 0.3`, attention and activation dropout 0. Here: the same.
- Loss: label-smoothed cross-entropy with 0.1 (the fork's default criterion). Here: label smoothing 0.1 (§5.4).
- Optimizer: Adam, betas (0.9, 0.98), eps 1e-8, no weight decay, `--clip-norm 25` (the fork's defaults). Here:
  Adam (0.9, 0.98), eps 1e-9 (§5.3), and no gradient clipping (the library has none; at norm 25 it rarely acts).
- Schedule: `inverse_sqrt`, `--lr 0.005`, `--warmup-updates 2000`: linear warmup to 0.005 at update 2,000, then
  0.005 * sqrt(2000 / update). Here: equation (3) of §5.3 with warmup 2,000 and `--lr-scale` 2.5298 =
  0.005 / (128^-0.5 * 2000^-0.5), the same curve (eq. 3 also rises linearly, then falls as the inverse square
  root), one update ahead (eq. 3 counts steps from 1; fairseq's first update uses its initial 1e-7).
- Batch: `--max-tokens 4096` per GPU on 2 GPUs (`CUDA_VISIBLE_DEVICES=0,1`): ~8,192 tokens per update. Here:
  `--batch-tokens 8192` (per side, padding included) on one device.
- Length: `--max-update 8000`. Here: `--max-steps 8000`.
- Early stop: `--patience 10`, stop once validation loss has not improved for 10 epochs. Here: no early stop (the
  library stops early on validation BLEU only): all 8,000 updates, validation loss every epoch, and the results
  record the epoch at which fairseq's patience would have stopped.
- Checkpoints: one per epoch, the last 10 averaged (`evaluate.sh`: `average_checkpoints.py
  --num-epoch-checkpoints 10`). Here: one per epoch (`--checkpoint-every` = the epoch's batch count), the last 10
  averaged (§6.1).
- Search: beam 5 with fairseq's length normalization (`--lenpen 1`: log P / length, the end token counted;
  `sequence_generator.py`). Here: the same, `length_penalty="average"` with alpha 1.0 (not the library's default,
  GNMT's ((5 + length) / 6) ** alpha, which favours shorter outputs: with it, seeds 0 and 1 scored 40.79 and 41.76
  on validation, brevity penalty 0.969 and 0.964; with fairseq's rule 41.19 and 41.85).
- Score: fairseq's BLEU-4 of the tokenized lower-cased output against `test_2016_flickr.lc.norm.tok.de` (12,103
  reference tokens). Here: sacreBLEU with `tokenize="none"` on the same tokens, against the same file.
- Seed: fairseq's default 1. Here: `--seed` (0, 1 and 2 for the three runs).
- Precision: float32. Here: `auto`, mixed bfloat16 on CPUs that compute it natively, else float32.

Training counts updates, so a busy machine slows a run but does not change it;
an interrupted run resumes from its last checkpoint when started again with the
same command. The script ends by exporting a SavedModel (the recipe's search,
float32) into `OUTPUT/export/` and writing `OUTPUT/reproduction.json` with the
validation and test2016 scores: BLEU on the lower-cased tokenized text (the
published measure), and, through the library's `corpus_scores` on the
Moses-detokenized output, chrF and cased sacreBLEU (cased against the cased
references, so low for a lower-cased system; reported for completeness).
The export, like the published model, expects lower-cased, tokenized input.

Run:
    python examples/reproduce_multi30k.py --seed 0 --output runs/reproduce/seed0
    python examples/reproduce_multi30k.py --seed 0 --batch-tokens 9216 --output runs/reproduce/batch9216_seed0
    python examples/reproduce_multi30k.py --summarize runs/reproduce/seed0 runs/reproduce/seed1 \\
        runs/reproduce/seed2 --json benchmarks/results/<cpu>/reproduce_multi30k.json
    make reproduce                                   # the three seeds, then the summary
"""

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

PUBLISHED = {"test2016": 41.02, "test2017": 33.36, "source": "Wu et al. (2021), LividWo/Revisit-MMT README-baseline.md"}
SPLITS = ("train", "val", "test2016")
D_MODEL, WARMUP, PEAK_LR = 128, 2000, 0.005
# Equation (3) peaks at d_model^-0.5 * warmup^-0.5 at the end of warmup; fairseq's inverse_sqrt at --lr.
LR_SCALE = PEAK_LR / (D_MODEL**-0.5 * WARMUP**-0.5)
PUBLISHED_BATCH_TOKENS = 8192  # --max-tokens 4096 on each of 2 GPUs
RECIPE = dict(
    preset="mini",
    vocab_size=9713,
    batch_tokens=PUBLISHED_BATCH_TOKENS,
    max_steps=8000,
    warmup_steps=WARMUP,
    lr_scale=round(LR_SCALE, 4),
    label_smoothing=0.1,
    dropout=0.3,
    attention_dropout=0.0,
    average_last=10,
    keep_checkpoints=10,
    precision="auto",
    validate_bleu_every=1000,
    log_every=100,
    text="lowercased_tokenized",
)
# What the model reads and writes: the published data (lower-cased, Moses-tokenized), or the corpus as written.
TEXT_FORMS = {"lowercased_tokenized": "lower-cased Moses-tokenized English", "raw": "English as written"}
# What a run recorded before a recipe key existed had.
LEGACY_RECIPE = {"text": "lowercased_tokenized"}
BEAM, ALPHA, LENGTH_PENALTY = 5, 1.0, "average"  # fairseq's --beam 5 --lenpen 1
FAIRSEQ_PATIENCE = 10


def write_json(path, data):
    """Writes `data` whole or not at all (`run_dir.atomic_write_text`: a crash keeps the file it replaces),
    creating its directory first, since a new machine's results directory is the usual case."""
    from keras_transformer.run_dir import atomic_write_text

    text = json.dumps(data, indent=2, ensure_ascii=False)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    atomic_write_text(path, text)


def prepare_data(output, limit=None, text="lowercased_tokenized"):
    """Writes OUTPUT/data/{split}.{en,de}: lower-cased, punctuation-normalized, Moses-tokenized (as published),
    or with `text="raw"` the corpus as written (`TEXT_FORMS`).

    `limit`: only the first `limit` pairs of each split (smoke tests). A run directory keeps the text form it
    was made with (`data/TEXT`): another one is refused.
    """
    from keras_transformer.data import corpora
    from keras_transformer.inference.evaluation import moses_tokenize_lowercase

    if text not in TEXT_FORMS:
        raise SystemExit(f"reproduce_multi30k: text must be one of {', '.join(TEXT_FORMS)}, got {text!r}")
    directory = os.path.join(output, "data")
    os.makedirs(directory, exist_ok=True)
    marker = os.path.join(directory, "TEXT")
    made = None
    if os.path.exists(marker):
        with open(marker, encoding="utf-8") as f:
            made = f.read().strip()
    elif os.path.exists(os.path.join(directory, "train.en")):
        made = LEGACY_RECIPE["text"]  # written before the text form was recorded
    if made not in (None, text):
        raise SystemExit(f"reproduce_multi30k: {directory} holds {made} text, not {text}; use another --output")
    with open(marker, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    for split in SPLITS:
        for lang in ("en", "de"):
            path = os.path.join(directory, f"{split}.{lang}")
            lines = corpora.read_lines(split, lang)[:limit]
            if os.path.exists(path) and sum(1 for _ in open(path, encoding="utf-8")) == len(lines):
                continue
            lines = [line.strip() for line in lines]
            if text == "lowercased_tokenized":
                lines = moses_tokenize_lowercase(lines, lang)
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            os.replace(path + ".tmp", path)
    return data_spec(output)


def data_spec(output):
    """The `TrainingArgs.data` of the files `prepare_data` writes into the run directory `output`."""
    directory = os.path.join(output, "data")
    return f"files:{directory}/{{split}}.en,{directory}/{{split}}.de"


def epoch_length(args):
    """Batches per epoch of this recipe's data (the vocabulary is trained into the run directory, as `train` would)."""
    import tensorflow as tf

    from keras_transformer.data.spec import DataSpec
    from keras_transformer.run_dir import get_or_train_tokenizer
    from keras_transformer.training.stream import TrainingData

    spec = DataSpec.parse(args.data)
    tokenizer = get_or_train_tokenizer(args.output, lambda: spec.training_texts(args.src, args.tgt), args.vocab_size)
    text = spec.load("train", args.src, args.tgt, shuffle_seed=args.seed)
    max_length = args.model_config().max_length
    replicas = args.batch_multiple or tf.distribute.get_strategy().num_replicas_in_sync
    return TrainingData(args, tokenizer, text, replicas, max_length).batches_per_epoch()


def training_args(seed, output, limit=None, recipe=None):
    """A recipe (default: the published one) as `TrainingArgs`, checkpointing once per epoch."""
    import dataclasses

    from keras_transformer.training import TrainingArgs

    recipe = dict(recipe or RECIPE)
    overrides = {key: recipe.pop(key) for key in ("label_smoothing", "dropout", "attention_dropout")}
    data = prepare_data(output, limit, recipe.pop("text", LEGACY_RECIPE["text"]))
    args = TrainingArgs(output=output, data=data, seed=seed, overrides=overrides, **recipe)
    config_path = os.path.join(output, "config.json")
    if os.path.exists(config_path):  # a resume: the epoch the run started with
        with open(config_path, encoding="utf-8") as f:
            steps = json.load(f)["data"]["steps_per_epoch"]
    else:
        steps = epoch_length(args)
    # One checkpoint per epoch and no others: the last 10 are the last 10 epochs, as published.
    return dataclasses.replace(args, checkpoint_every=steps, checkpoint_minutes=None, validate_every=1)


def translate_and_score(translator, output, split, limit=None, text="lowercased_tokenized"):
    """Beam search on one split; BLEU on lower-cased tokens as published, and `corpus_scores` on detokenized text.

    A model of raw text (`text="raw"`) is scored on its output lower-cased and Moses-tokenized, as the published
    references were made.
    """
    from sacrebleu.metrics import BLEU
    from sacremoses import MosesDetokenizer

    from keras_transformer.data import corpora
    from keras_transformer.inference.evaluation import corpus_scores, moses_tokenize_lowercase

    with open(os.path.join(output, "data", f"{split}.en"), encoding="utf-8") as f:
        sources = f.read().splitlines()
    references = corpora.read_lines(split, "de")[:limit]
    hypotheses = translator.translate(sources)
    with open(os.path.join(output, f"{split}.hyp.de"), "w", encoding="utf-8") as f:
        f.write("\n".join(hypotheses) + "\n")
    reference_tokens = moses_tokenize_lowercase([line.strip() for line in references], "de")
    if text == "raw":
        tokens, detokenized = moses_tokenize_lowercase(hypotheses, "de"), hypotheses
    else:
        detokenizer = MosesDetokenizer("de")
        tokens, detokenized = hypotheses, [detokenizer.detokenize(line.split(), unescape=True) for line in hypotheses]
    published = BLEU(tokenize="none", force=True).corpus_score(tokens, [reference_tokens])
    scores = corpus_scores(detokenized, references, lang="de")
    return {
        "tok_bleu": round(published.score, 2),
        "tok_bleu_details": str(published),
        "detokenized": {key: scores[key] for key in ("tok_bleu", "bleu", "bleu_signature", "chrf", "chrf_signature")},
    }


def patience_stop(history):
    """The epoch at which fairseq's `--patience 10` (on validation loss) would have stopped, or None."""
    best, since = float("inf"), 0
    for row in history:
        loss = float(row.get("val_loss") or "nan")
        if loss < best:
            best, since = loss, 0
        else:
            since += 1
            if since >= FAIRSEQ_PATIENCE:
                return int(row["epoch"]) + 1
    return None


def machine():
    from keras_transformer.hardware import cpu_flags, cpu_identity

    flags = sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
    return dict(**cpu_identity(), cpu_count=os.cpu_count(), load_average=list(os.getloadavg()), flags=flags)


def versions():
    from importlib import metadata

    return {name: metadata.version(name) for name in ("keras-transformer", "tensorflow", "keras", "sacrebleu")}


def run(seed, output, export=True, limit=None, recipe=None, splits=SPLITS[1:], command=None, extra=None):
    """Trains (or resumes) one seed of a recipe (default: the published one), scores `splits`, exports.

    Returns the report, also written to `OUTPUT/reproduction.json`. `command` is the one recorded (default: this
    script's); `recipe` is a dict like `RECIPE`; `extra` holds further report fields (e.g. the trial's name),
    recorded in the report and in the export's metadata.
    """
    from keras_transformer import training
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.inference.translator import Translator
    from keras_transformer.training.curves import plot_curves

    recipe = {**LEGACY_RECIPE, **(recipe or RECIPE)}
    args = training_args(seed, output, limit, recipe)
    started = time.perf_counter()
    result = training.train(args)
    if result.stopped_on_nan:
        raise SystemExit(f"reproduce_multi30k: seed {seed} diverged (NaN loss) in {output}")
    translator = Translator(result.model, result.tokenizer, beam_size=BEAM, alpha=ALPHA, length_penalty=LENGTH_PENALTY)
    report = dict(
        seed=seed,
        step=result.step,
        steps_per_epoch=args.checkpoint_every,
        epochs=round(result.step / args.checkpoint_every, 2),
        train_seconds=_trained_seconds(output),
        val_metrics=result.val_metrics,
        fairseq_patience_stop_epoch=patience_stop(result.history),
        **{split: translate_and_score(translator, output, split, limit, recipe["text"]) for split in splits},
        beam=BEAM,
        alpha=ALPHA,
        length_penalty=LENGTH_PENALTY,
        recipe=recipe,
        training=args.to_dict(),
        command=command
        or f"python examples/reproduce_multi30k.py --seed {seed} --output {output}" + _experiment_flags(),
        machine=machine(),
        versions=versions(),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **(extra or {}),
    )
    plot_curves(output)
    if export:
        metadata = {key: report[key] for key in ("command", "seed", "step", "epochs", "machine", "date", "recipe")}
        metadata.update(extra or {})
        metadata.update({split: report[split] for split in splits}, input=TEXT_FORMS[recipe["text"]])
        path = export_saved_model(output, os.path.join(output, "export"), beam_size=BEAM, alpha=ALPHA,
                                  length_penalty=LENGTH_PENALTY, version=1,
                                  overwrite=True, metadata=metadata, dtype="float32")  # fmt: skip
        report["export_path"] = str(path)
    report["wall_seconds_this_process"] = round(time.perf_counter() - started, 1)
    report["earlier_searches"] = earlier_searches(output, report)
    write_json(os.path.join(output, "reproduction.json"), report)
    scores = ", ".join(f"{split} {report[split]['tok_bleu']:.2f}" for split in splits)
    print(f"seed {seed}: {scores} (lower-cased tokenized BLEU; published test2016 {PUBLISHED['test2016']})")
    return report


def earlier_searches(output, report):
    """The scores of the run's earlier searches (another length penalty or alpha), from its previous report:
    a run scored again with another search keeps what the first search gave."""
    path = os.path.join(output, "reproduction.json")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        previous = json.load(f)
    searches = previous.get("earlier_searches", [])
    search = dict(beam=previous["beam"], alpha=previous["alpha"], length_penalty=previous.get("length_penalty", "gnmt"))
    if search != {key: report[key] for key in search}:
        searches.append(
            dict(search, **{split: previous[split]["tok_bleu"] for split in SPLITS[1:] if split in previous})
        )
    return searches


def _experiment_flags():
    """The command-line flags of an experiment that changes the recipe ("" for the published recipe)."""
    return f" --batch-tokens {RECIPE['batch_tokens']}" if RECIPE["batch_tokens"] != PUBLISHED_BATCH_TOKENS else ""


def _trained_seconds(output):
    """Wall time of training over every process of the run, from `steps.csv` (its clock restarts on a resume)."""
    from keras_transformer.run_dir import read_csv

    total = previous = 0.0
    for row in read_csv(os.path.join(output, "steps.csv")):
        elapsed = float(row["elapsed_sec"])
        if elapsed < previous:  # a resumed process
            total += previous
        previous = elapsed
    return round(total + previous, 1)


def summarize(run_dirs, json_path=None, plot_path=None, script="examples/reproduce_multi30k.py"):
    """Mean and sample standard deviation over the runs' `reproduction.json`, the curves of all seeds in one PNG.

    `script` is the one named in the recorded command (this one, or `examples/long_multi30k.py`).
    """
    import statistics

    reports = []
    for run_dir in run_dirs:
        with open(os.path.join(run_dir, "reproduction.json"), encoding="utf-8") as f:
            reports.append(json.load(f))
    command = f"python {script} --summarize " + " ".join(run_dirs)
    command += (f" --json {json_path}" if json_path else "") + (f" --plot {plot_path}" if plot_path else "")
    summary = dict(command=command, versions=versions(), machine=machine(), date=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    summary.update(published=PUBLISHED, runs=reports)
    for split in ("val", "test2016"):
        values = [r[split]["tok_bleu"] for r in reports]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        summary[split] = {"mean": round(statistics.mean(values), 2), "sd": round(spread, 2), "values": values}
    summary["train_hours"] = [round((r["train_seconds"] or 0) / 3600, 2) for r in reports]
    earlier = [search for r in reports for search in r.get("earlier_searches", [])]
    for search in {(s["beam"], s["alpha"], s["length_penalty"]) for s in earlier}:
        runs = [s for s in earlier if (s["beam"], s["alpha"], s["length_penalty"]) == search]
        summary.setdefault("earlier_searches", []).append(
            dict(zip(("beam", "alpha", "length_penalty"), search), runs=len(runs),
                 **{split: round(statistics.mean(s[split] for s in runs), 2) for split in ("val", "test2016")})
        )  # fmt: skip
    if plot_path:
        os.makedirs(os.path.dirname(os.path.abspath(plot_path)), exist_ok=True)  # a new machine's results directory
        _plot_runs(run_dirs, plot_path)
        summary["curves"] = os.path.basename(plot_path)
    if json_path:
        write_json(json_path, summary)
    print(f"test2016 {summary['test2016']['mean']:.2f} ± {summary['test2016']['sd']:.2f}, "
          f"val {summary['val']['mean']:.2f} ± {summary['val']['sd']:.2f} over {len(reports)} seeds")  # fmt: skip
    return summary


def _plot_runs(run_dirs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from keras_transformer.run_dir import read_csv

    figure, (loss_axis, bleu_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for run_dir in run_dirs:
        label = os.path.basename(os.path.normpath(run_dir))
        rows = read_csv(os.path.join(run_dir, "history.csv"))
        steps = [float(r["step"]) for r in rows if r.get("val_loss")]
        loss_axis.plot(steps, [float(r["val_loss"]) for r in rows if r.get("val_loss")], ".-", label=label)
        bleu = read_csv(os.path.join(run_dir, "bleu.csv"))
        bleu_axis.plot([float(r["step"]) for r in bleu], [float(r["bleu"]) for r in bleu], ".-", label=label)
    loss_axis.set(xlabel="update", ylabel="validation loss", title="Validation loss")
    bleu_axis.set(xlabel="update", ylabel="BLEU (greedy)", title="Validation BLEU")
    for axis in (loss_axis, bleu_axis):
        axis.legend()
        axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0, help="seed of weights, dropout and data order (default 0)")
    parser.add_argument("--output", default=None, help="run directory (default runs/reproduce/seedN)")
    parser.add_argument("--no-export", dest="export", action="store_false", help="do not export a SavedModel")
    parser.add_argument("--limit", type=int, help="only the first N pairs of each split (a smoke test)")
    parser.add_argument(
        "--batch-tokens",
        type=int,
        default=PUBLISHED_BATCH_TOKENS,
        help="an experiment, not the published recipe: tokens per update, padding included (default 8192; 9216 "
        "holds as many real target tokens as fairseq's batches, docs/reproduction_fairseq.md)",
    )
    parser.add_argument("--summarize", nargs="+", metavar="RUN_DIR", help="summarize finished runs instead")
    parser.add_argument("--json", help="with --summarize: write the summary here")
    parser.add_argument("--plot", help="with --summarize: the runs' validation curves (PNG)")
    namespace = parser.parse_args(argv)
    if namespace.summarize:
        summarize(namespace.summarize, namespace.json, namespace.plot)
        return 0
    RECIPE["batch_tokens"] = namespace.batch_tokens
    run(namespace.seed, namespace.output or f"runs/reproduce/seed{namespace.seed}", namespace.export, namespace.limit)
    return 0


if __name__ == "__main__":
    from keras_transformer.cli import run_script

    run_script(main, "reproduce_multi30k.py")
