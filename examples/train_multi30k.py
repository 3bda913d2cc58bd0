"""Train English→German on Multi30k with model.fit, then translate and score test2016.

The job `make demo` runs, on a CPU: the paper's training recipe (Vaswani et
al., 2017: Adam and the warmup schedule of §5.3, label smoothing and dropout
of §5.4, checkpoint averaging of §6.1) on a model sized for a small machine,
then beam search (§6.1; beam size and length penalty chosen on the validation
split) on the 1,000 sentences of test2016, scored with cased sacreBLEU, chrF
and the lower-cased Moses-tokenized BLEU that Multi30k results are usually
given in (the "Transformer-tiny" of Wu et al., 2021: 41.0).

Everything lands in the run directory (default runs/multi30k_en_de: see
keras_transformer.run_dir); run the same command again after an
interruption and training continues from the last checkpoint. The model is
then exported as a SavedModel for TensorFlow Serving to
saved_models/multi30k_en_de/, with the same decoding options.

Run:
    python examples/train_multi30k.py                      # the demo (~30 min on 2 CPU cores)
    python examples/train_multi30k.py --max-steps 20 --preset tiny --vocab-size 500 \\
        --eval-limit 8 --output /tmp/smoke --no-export      # seconds: a smoke test

Any `keras-transformer train` option works here too (see --help).
"""

import argparse
import dataclasses
import json
import os
import resource
import shlex
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer import training  # noqa: E402
from keras_transformer.cli import run_script  # noqa: E402
from keras_transformer.cli import train as train_cli  # noqa: E402
from keras_transformer.data import corpora  # noqa: E402
from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE  # noqa: E402
from keras_transformer.inference.evaluation import corpus_scores, format_scores  # noqa: E402
from keras_transformer.inference.saved_model import export_saved_model  # noqa: E402
from keras_transformer.inference.translator import MAX_BATCH_SIZE, Translator  # noqa: E402
from keras_transformer.run_dir import read_config  # noqa: E402

# The demo's recipe, chosen on the validation split by benchmarks/recipe_trials.py
# (results: benchmarks/results/avx512_bf16/recipe_trials.json). It is the
# paper's training (§5.3, §5.4, §6.1) on a model and schedule sized for 30
# minutes on two CPU cores:
# - the "small" preset (N=3, d_model 256, h 4, d_ff 1024, 7.6M parameters with
#   a joint BPE vocabulary of 8,000) on batches of 4,096 tokens per side
#   (~139 steps per epoch); the narrower 4-layer "mini" preset ran only 1.4x
#   faster per token on a 2-core CPU and learned far slower per epoch;
# - the paper's label smoothing 0.1, and its dropout 0.1 where the budget
#   trains long enough to need it (`demo_dropout`): without dropout the model
#   overfits from the 9th epoch of the ~15 a CPU with AVX512_BF16 reaches,
#   while in the ~6 epochs of float32 on an AVX2 CPU dropout only slows it
#   (2.2 BLEU lower on validation there), so the demo drops nothing there;
# - a short warmup and a higher peak rate than the paper's (equation 3 with
#   warmup 400, times 0.8: peak 2.5e-3), for a run of ~2,000 steps;
# - the average of the checkpoints written in the run's final fifth, 50 steps
#   apart, at most 10 (§6.1 averages the last 5): the 10 of ~2,000-2,700
#   steps on a CPU with AVX512_BF16, the 5 of the ~860 steps an AVX2 CPU
#   reaches, where the last 10 reached back to mid-training and scored 1.8
#   BLEU below the last 5 on validation;
# - BLEU on the validation split every 500 steps (greedy; a few seconds each,
#   inside the budget);
# - training stops after 27.5 minutes (--time-budget), so that with the
#   vocabulary, evaluation and export the demo takes ~30 minutes on any
#   machine. How far it gets depends on the CPU: precision "auto" trains in
#   mixed_bfloat16 where the CPU computes it natively (AVX512_BF16, AMX) and
#   in float32 elsewhere.
# Beam search on test2016 uses the beam size and length penalty that scored
# best on the validation split (--beam, --alpha below).
DEMO_DEFAULTS = dict(
    output="runs/multi30k_en_de",
    data="multi30k",
    src="en",
    tgt="de",
    preset="small",
    vocab_size=8000,
    batch_tokens=4096,
    precision="auto",
    epochs=40,
    time_budget=27.5,
    warmup_steps=400,
    lr_scale=0.8,
    checkpoint_every=50,
    keep_checkpoints=10,
    average_last=10,
    average_fraction=0.2,
    validate_bleu_every=500,
    log_every=25,
)
# Where the budget trains ~6 epochs rather than ~15 (`demo_dropout`).
SHORT_RUN_DROPOUT = 0.0
DEMO_BEAM_SIZE, DEMO_ALPHA = 5, 1.0  # validation BLEU: +0.3 over the paper's beam 4, alpha 0.6 (§6.1)

EXPORT_DIR = "saved_models/multi30k_en_de"


def build_parser():
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    train_cli.add_training_arguments(parser, DEMO_DEFAULTS)
    evaluation = parser.add_argument_group("evaluation and export")
    evaluation.add_argument(
        "--eval-split",
        default="test2016",
        choices=corpora.MULTI30K_SPLITS,
        help="Multi30k split to score (default test2016)",
    )
    evaluation.add_argument(
        "--eval-limit", type=int, default=None, help="score only the first N sentences (default all of the split)"
    )
    evaluation.add_argument(
        "--beam",
        type=int,
        default=DEMO_BEAM_SIZE,
        help="beam size (default %(default)s, chosen on validation BLEU; the paper's is 4, §6.1)",
    )
    evaluation.add_argument(
        "--alpha",
        type=float,
        default=DEMO_ALPHA,
        help="length penalty (default %(default)s, chosen on validation BLEU; the paper's is 0.6)",
    )
    evaluation.add_argument(
        "--eval-batch-size",
        type=int,
        default=DEFAULT_TRANSLATE_BATCH_SIZE,
        help="the most sentences per decoding call (default %(default)s)",
    )
    evaluation.add_argument("--samples", type=int, default=5, help="sample translations to print")
    evaluation.add_argument("--export-dir", default=EXPORT_DIR, help=f"SavedModel directory (default {EXPORT_DIR})")
    evaluation.add_argument("--no-export", dest="export", action="store_false", help="do not export a SavedModel")
    return parser


def demo_dropout(precision, native_precision, has_gpu):
    """The demo's dropout: `SHORT_RUN_DROPOUT`, or None for the preset's (the paper's 0.1, §5.4).

    How many epochs 27.5 minutes buy decides it, and the hardware tells that
    in advance: a GPU, or a CPU training in the bfloat16 it computes
    natively, reaches ~15 epochs of Multi30k, where dropout 0 overfits from
    the 9th on; a CPU training in float32 (or in emulated bfloat16) reaches
    ~6, where dropout 0.1 only slows learning: on an AVX2 EPYC, validation
    BLEU 36.71 without dropout against 34.48 with it, and a lower validation
    loss after every epoch (`benchmarks/results/amd_epyc_avx2/recipe_trials.json`).

    Args:
        precision: the dtype policy the run trains in ("auto" resolved).
        native_precision: what `--precision auto` chooses on this machine.
        has_gpu: whether TensorFlow sees a GPU.
    """
    if has_gpu or (precision != "float32" and precision == native_precision):
        return None
    return SHORT_RUN_DROPOUT


def training_args(namespace, native_precision=None, has_gpu=None):
    """The run's `TrainingArgs`: the command line's, with `demo_dropout` unless a dropout was given.

    `demo_dropout` holds for the demo's time budget or a shorter one; a run
    given more time (or none) keeps the paper's dropout. `native_precision`
    and `has_gpu` describe the machine (default: this one's).
    """
    from keras_transformer import hardware

    args = train_cli.args_from_namespace(namespace)
    if "dropout" in args.overrides or args.time_budget is None or args.time_budget > DEMO_DEFAULTS["time_budget"]:
        return args
    if native_precision is None:
        native_precision = hardware.auto_precision()[0]
    if has_gpu is None:
        has_gpu = bool(hardware.gpu_compute_capabilities())
    precision = native_precision if args.precision == "auto" else args.precision
    dropout = demo_dropout(precision, native_precision, has_gpu)
    if dropout is None:
        return args
    print(
        f"Dropout {dropout:g} (the paper's is 0.1): in {precision} on this CPU, {args.time_budget:g} minutes "
        "train ~6 epochs, too few for dropout to pay (--dropout 0.1 keeps it).",
        flush=True,
    )
    return dataclasses.replace(args, overrides={**args.overrides, "dropout": dropout})


def machine():
    """The CPU the demo ran on, as its figures should be quoted: model, family, cores, bfloat16 features."""
    from keras_transformer.hardware import cpu_flags, cpu_identity

    return dict(
        **cpu_identity(),
        cpu_count=os.cpu_count(),
        load_average=list(os.getloadavg()),
        flags=sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}),
    )


def versions():
    from importlib import metadata

    return {name: metadata.version(name) for name in ("keras-transformer", "tensorflow", "keras", "sacrebleu")}


def check_evaluation_options(parser, namespace):
    """Refuses, before training, what would only fail once the model is trained."""
    for flag, lang in (("--src", namespace.src), ("--tgt", namespace.tgt)):
        if lang not in corpora.MULTI30K_LANGUAGES:
            parser.error(
                f"{flag} {lang}: the demo scores Multi30k, whose languages are {', '.join(corpora.MULTI30K_LANGUAGES)}."
            )
    if not 1 <= namespace.eval_batch_size <= MAX_BATCH_SIZE:
        parser.error(f"--eval-batch-size must be between 1 and {MAX_BATCH_SIZE}, got {namespace.eval_batch_size}.")


def main(argv=None):
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else argv
    namespace = parser.parse_args(argv)
    check_evaluation_options(parser, namespace)
    args = training_args(namespace)
    command = "python examples/train_multi30k.py " + shlex.join(argv)

    job_started = started = time.perf_counter()
    result = training.train(args)
    train_seconds = time.perf_counter() - started
    if result.stopped_on_nan:
        print("Training diverged (NaN loss); not evaluating.")
        return {"stopped_on_nan": True}
    if not result.is_chief:  # under MultiWorkerMirroredStrategy the chief evaluates and exports
        return {"step": result.step, "is_chief": False}

    sources = corpora.read_lines(namespace.eval_split, args.src)
    references = corpora.read_lines(namespace.eval_split, args.tgt)
    if namespace.eval_limit:
        sources, references = sources[: namespace.eval_limit], references[: namespace.eval_limit]
    print(
        f"\nTranslating {len(sources)} sentences of Multi30k {namespace.eval_split} "
        f"({args.src}->{args.tgt}, beam {namespace.beam}, alpha {namespace.alpha}) ...",
        flush=True,
    )
    started = time.perf_counter()
    translator = Translator(result.model, result.tokenizer, beam_size=namespace.beam, alpha=namespace.alpha)
    hypotheses = translator.translate(sources, batch_size=namespace.eval_batch_size)
    decode_seconds = time.perf_counter() - started
    scores = corpus_scores(hypotheses, references, lang=args.tgt)
    print(
        f"\nMulti30k {namespace.eval_split} {args.src}->{args.tgt}, {len(sources)} sentences, "
        f"step {result.step} ({decode_seconds:.0f} s to translate):"
    )
    print(format_scores(scores))

    with open(os.path.join(result.run_dir, f"{namespace.eval_split}.hyp.{args.tgt}"), "w", encoding="utf-8") as f:
        f.write("\n".join(hypotheses) + "\n")
    report = dict(
        split=namespace.eval_split,
        step=result.step,
        beam=namespace.beam,
        alpha=namespace.alpha,
        train_seconds=round(train_seconds, 1),
        decode_seconds=round(decode_seconds, 1),
        tokens_per_sec=result.tokens_per_sec,
        val_metrics=result.val_metrics,
        **scores,
        epochs=round(result.step / read_config(result.run_dir)["data"]["steps_per_epoch"], 2),
        best_val_bleu=result.best_val_bleu,
        command=command,
        training=args.to_dict(),
        machine=machine(),
        versions=versions(),
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    report_path = os.path.join(result.run_dir, f"{namespace.eval_split}_scores.json")

    print("\nSample translations:")
    for source, reference, hypothesis in list(zip(sources, references, hypotheses))[: namespace.samples]:
        print(f"  SRC  {source}\n  REF  {reference}\n  HYP  {hypothesis}\n")

    report["export_path"] = None
    if namespace.export:
        metadata = {
            key: report[key]
            for key in (
                "command",
                "machine",
                "date",
                "step",
                "epochs",
                "train_seconds",
                "val_metrics",
                "best_val_bleu",
                "beam",
                "alpha",
                "sentences",
            )
        }
        metadata[namespace.eval_split] = {key: scores[key] for key in scores}
        # float32: the exported model must serve at full speed on any CPU (the library's
        # export_saved_model defaults to "auto", which writes bfloat16 on a CPU with AVX512_BF16).
        path = export_saved_model(
            result.run_dir,
            namespace.export_dir,
            beam_size=namespace.beam,
            alpha=namespace.alpha,
            metadata=metadata,
            dtype="float32",
        )
        report["export_path"] = str(path)
        print(f"Exported SavedModel to {path}")
    # The whole job, training to export; the peak resident memory of this process.
    report["wall_seconds"] = round(time.perf_counter() - job_started, 1)
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    with open(report_path, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2, ensure_ascii=False)
    print(f"Done in {report['wall_seconds'] / 60:.1f} min; scores in {report_path}")
    return report


if __name__ == "__main__":
    run_script(lambda: 1 if main().get("stopped_on_nan") else 0, "train_multi30k.py")
