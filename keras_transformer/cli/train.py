"""`keras-transformer train`: train (or continue) a run with model.fit under tf.distribute.

`add_training_arguments` and `args_from_namespace` are also what the
examples use to take the same flags.
"""

import argparse
import dataclasses
import json

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.startup import native_logs_silenced
from keras_transformer.config import PRESETS
from keras_transformer.training.options import PRECISION_CHOICES, TrainingArgs

DEFAULT_EPOCHS = 10  # what `training` runs with neither --epochs nor --max-steps (`TrainingArgs.epochs`)


def register(subparsers):
    parser = subparsers.add_parser(
        "train",
        help=COMMAND_HELP["train"],
        description=(
            "Trains a Transformer (Vaswani et al., 2017) with the paper's optimizer, schedule and "
            "regularization (§5.3, §5.4) into a run directory. Run the same command again to continue "
            "an interrupted run from its last checkpoint."
        ),
    )
    add_training_arguments(parser)
    parser.set_defaults(func=run)


def run(namespace):
    args = args_from_namespace(namespace)
    from keras_transformer.training import train  # which checks the data files before it makes the run directory

    with native_logs_silenced():  # the C++ logging of the libraries (SentencePiece's); Python's output shows
        result = train(args)
    return 1 if result.stopped_on_nan else 0


def _parse_value(text):
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


_NOT_GIVEN = object()  # a flag left out, told apart from an explicit value equal to the default


def _float_or_none(text):
    """A number, or "none" for None."""
    return None if text.strip().lower() == "none" else float(text)


def _int_or_none(text):
    """An integer, or "none" for None."""
    return None if text.strip().lower() == "none" else int(text)


_CONFIG_FLAGS = (
    # flag, TransformerConfig field, type, help
    ("--num-layers", "num_layers", int, "N, layers per stack (§3.1)"),
    ("--d-model", "d_model", int, "d_model (§3.1)"),
    ("--num-heads", "num_heads", int, "h, attention heads (§3.2.2)"),
    ("--d-ff", "d_ff", int, "d_ff, feed-forward inner width (§3.3)"),
    ("--key-dim", "key_dim", int, "d_k (default d_model / h)"),
    ("--value-dim", "value_dim", int, "d_v (default d_model / h)"),
    ("--dropout", "dropout", float, "P_drop, residual dropout (§5.4)"),
    ("--attention-dropout", "attention_dropout", float, "dropout on attention weights (0 in the paper)"),
    ("--label-smoothing", "label_smoothing", float, "epsilon_ls (§5.4; 0.1)"),
    ("--positional-encoding", "positional_encoding", str, "sinusoidal (§3.5) or learned"),
)


def add_training_arguments(parser, defaults=None):
    """Adds the `train` options to an argparse parser (also used by the examples)."""
    d = TrainingArgs(**(defaults or {}))
    _add_model_flags(parser, d)
    _add_data_flags(parser, d)
    _add_schedule_flags(parser, d)
    _add_run_flags(parser, d)
    _add_checkpoint_flags(parser, d)
    _add_validation_flags(parser, d)
    return parser


def _add_model_flags(parser, d):
    """The model's flags: preset, TransformerConfig fields, vocabulary."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--preset", choices=PRESETS, default=d.preset, help=f"model size (TransformerConfig preset; default {d.preset})"
    )
    for flag, field, kind, text in _CONFIG_FLAGS:
        # A caller's defaults may override the preset (the demo: dropout 0); they stay
        # out of the flag's default, so that --set can change them too.
        if field in d.overrides:
            text += f"; default here {d.overrides[field]}"
        else:
            text += "; default: the --preset's"
        model.add_argument(flag, dest=f"config_{field}", type=kind, default=None, metavar=field.upper(), help=text)
    parser.set_defaults(config_defaults=dict(d.overrides))
    model.add_argument(
        "--norm-first",
        dest="config_norm_first",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="pre-LN instead of the paper's post-LN (default: the --preset's, post-LN)",
    )
    model.add_argument(
        "--share-embeddings",
        dest="config_share_embeddings",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="tie source/target embeddings and the softmax weights (§3.4; default on)",
    )
    model.add_argument(
        "--set",
        dest="config_set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any TransformerConfig field, e.g. --set layer_norm_epsilon=1e-5 (repeatable). Order: the "
        "preset, then the command's defaults, then --set, then the named flags above",
    )
    model.add_argument(
        "--vocab-size", type=int, default=d.vocab_size, help=f"joint BPE vocabulary size (§5.1; default {d.vocab_size})"
    )
    model.add_argument(
        "--max-length",
        type=int,
        default=d.max_length,
        help="longest sequence in tokens; longer pairs are skipped (default: the config's, 256)",
    )


def _add_data_flags(parser, d):
    """Where the data comes from and how it is batched (§5.1)."""
    data = parser.add_argument_group("data")
    data.add_argument("--data", default=d.data, help="multi30k | tfds:NAME | files:SRC,TGT (default %(default)s)")
    data.add_argument("--src", default=d.src, help="source language (default %(default)s)")
    data.add_argument("--tgt", default=d.tgt, help="target language (default %(default)s)")
    data.add_argument(
        "--batch-tokens",
        type=int,
        default=d.batch_tokens,
        help="global tokens per batch and side, padding included (§5.1: ~25000; default %(default)s)",
    )
    data.add_argument(
        "--accumulate-steps",
        type=int,
        default=d.accumulate_steps,
        metavar="K",
        help="batches per optimizer update: K batches of --batch-tokens make the update of one batch of "
        "K times the tokens (gradient accumulation: §5.1's 25000 tokens on fewer devices); steps and "
        "the schedule count updates (default %(default)s)",
    )
    data.add_argument(
        "--pad-to-multiple-of",
        type=int,
        default=d.pad_to_multiple_of,
        metavar="N",
        help="length buckets (each batch's padded length) are multiples of N: 1 pads least, 8 gives "
        "fewer batch shapes (default %(default)s)",
    )
    data.add_argument(
        "--validation-split",
        default=d.validation_split,
        help="validation split ('none' for no validation; default %(default)s); files: paths "
        "need {split} for it, e.g. files:data/{split}.en,data/{split}.de",
    )
    data.add_argument(
        "--subword-sampling",
        type=float,
        default=d.subword_sampling,
        metavar="ALPHA",
        help="subword regularization of the training pairs: BPE-dropout probability (0.1 in "
        "Provilkov et al., 2020) or unigram alpha; each pass segments anew (default %(default)s: off)",
    )


def _add_schedule_flags(parser, d):
    """How long, at what learning rate (§5.2, §5.3) and with which loss."""
    schedule = parser.add_argument_group("schedule")
    schedule.add_argument(
        "--epochs",
        type=int,
        default=d.epochs,
        help="passes over the training data (default "
        + (f"{d.epochs})" if d.epochs else f"{DEFAULT_EPOCHS} when --max-steps is not given)"),
    )
    schedule.add_argument(
        "--max-steps",
        type=_int_or_none,
        default=d.max_steps,
        help="optimizer steps to train (wins over --epochs; §5.2: 100k base, 300k big"
        + (
            f"; default {d.max_steps}, none: --epochs decides)" if d.max_steps else "; default: none, --epochs decides)"
        ),
    )
    schedule.add_argument(
        "--steps-per-epoch",
        type=int,
        default=d.steps_per_epoch,
        help="epoch length for streamed tfds: data (default 1000)",
    )
    schedule.add_argument(
        "--time-budget",
        type=_float_or_none,
        default=d.time_budget,
        metavar="MINUTES",
        help="stop once training has taken this long (over resumes too), if before "
        "--max-steps/--epochs"
        + (f" (default {d.time_budget:g}; none for no budget)" if d.time_budget else " (default: none)"),
    )
    schedule.add_argument(
        "--warmup-steps", type=int, default=d.warmup_steps, help="warmup of equation (3) (§5.3; default %(default)s)"
    )
    schedule.add_argument(
        "--lr-scale", type=float, default=d.lr_scale, help="multiplier on equation (3) (default %(default)s)"
    )
    schedule.add_argument(
        "--cooldown",
        type=float,
        default=d.cooldown,
        metavar="FRACTION",
        help="lower the learning rate linearly to zero over this last fraction of the run (of "
        "--time-budget or of the steps, whichever ends it; not in the paper; "
        "default %(default)s: none)",
    )
    schedule.add_argument(
        "--rdrop-alpha",
        type=float,
        default=d.rdrop_alpha,
        metavar="ALPHA",
        help="R-Drop: run each batch twice under independent dropout masks and add ALPHA times the "
        "symmetric KL divergence of the two passes to the loss (not in the paper; 5 in R-Drop's IWSLT14 "
        "recipe; an update costs two passes: halve --batch-tokens to keep its cost; default %(default)s: off)",
    )


def _add_run_flags(parser, d):
    """Run directory, starting point, precision and seed."""
    run = parser.add_argument_group("run")
    run.add_argument("--output", "-o", default=d.output, help="run directory (default %(default)s)")
    run.add_argument(
        "--init-from",
        default=d.init_from,
        metavar="RUN_DIR",
        help="start from this run's model, vocabulary and weights (fine-tuning on new data); only "
        "dropout, attention dropout and label smoothing may differ (default: a new model)",
    )
    run.add_argument(
        "--resume-optimizer",
        action=argparse.BooleanOptionalAction,
        default=d.resume_optimizer,
        help="with --init-from: also its optimizer state and step (default: a fresh optimizer and warmup)",
    )
    run.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default=d.precision,
        help="Keras dtype policy (printed when training starts); default %(default)s, export's default "
        "too: the same results on every machine. auto: mixed_bfloat16 on a CPU with native bfloat16 "
        "(AVX512_BF16, AMX) or Ampere+ GPUs, mixed_float16 on Volta/Turing, else float32: faster, "
        "with results that depend on the machine",
    )
    run.add_argument(
        "--xla",
        action=argparse.BooleanOptionalAction,
        default=d.xla,
        help="compile the train step with XLA (default off)",
    )
    run.add_argument("--seed", type=int, default=d.seed, help="weights, dropout and data order (default %(default)s)")


def _add_checkpoint_flags(parser, d):
    """Checkpoints and the final model's weights: averaging (§6.1) or an EMA."""
    run = parser.add_argument_group("checkpoints")
    run.add_argument(
        "--checkpoint-every",
        type=int,
        default=d.checkpoint_every,
        help="steps between checkpoints / resume points (default %(default)s)",
    )
    run.add_argument(
        "--checkpoint-minutes",
        type=_float_or_none,
        default=d.checkpoint_minutes,
        metavar="MINUTES",
        help="also a checkpoint / resume point once MINUTES of training passed since the last one, so a CPU "
        "run loses little when stopped (§6.1 saved one every 10 minutes); none: by steps only "
        "(default %(default)s)",
    )
    run.add_argument(
        "--keep-checkpoints",
        type=int,
        default=d.keep_checkpoints,
        help="newest checkpoints to keep (at least --average-last; default %(default)s)",
    )
    run.add_argument(
        "--average-last",
        type=int,
        default=d.average_last,
        help="final model = mean of the last K checkpoints (§6.1: 5 base, 20 big; default "
        f"{d.average_last if d.average_last > 1 else 'off'})",
    )
    # Not given: the default, which only applies when averaging (--average-last 1 turns both off).
    run.add_argument(
        "--average-fraction",
        type=_float_or_none,
        default=_NOT_GIVEN,
        metavar="FRACTION",
        help="with --average-last: average only the checkpoints of the run's last FRACTION of steps "
        "(e.g. 0.2: its final fifth), however many steps a --time-budget allows; none: the last "
        f"K whatever their steps (default {d.average_fraction})",
    )
    parser.set_defaults(default_average_fraction=d.average_fraction)
    run.add_argument(
        "--ema",
        type=float,
        default=d.ema,
        metavar="DECAY",
        help="keep an exponential moving average of the weights (e.g. 0.999), validate with it and "
        "export it: an alternative to --average-last (default off)",
    )


def _add_validation_flags(parser, d):
    """Validation, logs and how the steps are run."""
    run = parser.add_argument_group("validation and logs")
    run.add_argument(
        "--validate-every",
        type=int,
        default=d.validate_every,
        help="epochs between validation runs (default %(default)s)",
    )
    run.add_argument(
        "--validate-bleu-every",
        type=_int_or_none,
        default=d.validate_bleu_every,
        metavar="STEPS",
        help="translate the validation split every STEPS steps (and at the end) and log its BLEU "
        "(progress output, bleu.csv, history.csv, TensorBoard); default "
        f"{str(d.validate_bleu_every) + ', none: off' if d.validate_bleu_every else 'off'}",
    )
    run.add_argument(
        "--bleu-search",
        choices=("greedy", "beam"),
        default=d.bleu_search,
        help="search for --validate-bleu-every: greedy or beam 4 (default %(default)s)",
    )
    run.add_argument(
        "--keep-best",
        action=argparse.BooleanOptionalAction,
        default=d.keep_best,
        help="keep the weights of the best validation BLEU in checkpoints/best.weights.h5 (default off)",
    )
    run.add_argument(
        "--early-stopping-patience",
        type=int,
        default=d.early_stopping_patience,
        metavar="K",
        help="stop after K validation BLEU measurements without improvement (default never)",
    )
    run.add_argument(
        "--log-every",
        type=int,
        default=d.log_every,
        help="steps between steps.csv rows and TensorBoard points (default %(default)s)",
    )
    run.add_argument(
        "--steps-per-execution",
        type=int,
        default=d.steps_per_execution,
        help="train steps per tf.function call (default %(default)s)",
    )
    run.add_argument(
        "--batch-multiple",
        type=int,
        default=d.batch_multiple,
        help="round batch sizes to a multiple of this (default: the replica count)",
    )
    run.add_argument(
        "--verbose", type=_parse_verbose, default=d.verbose, help="fit verbosity: auto, 0, 1, 2 (default %(default)s)"
    )


def _parse_verbose(text):
    return text if text == "auto" else int(text)


def args_from_namespace(namespace) -> TrainingArgs:
    """`TrainingArgs` from parsed `add_training_arguments` options."""
    ns = vars(namespace)
    # The preset, then the caller's defaults, then --set, then the named flags: later wins.
    overrides = dict(ns.get("config_defaults") or {})
    for item in ns.get("config_set") or []:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}.")
        key, value = item.split("=", 1)
        overrides[key.strip()] = _parse_value(value)
    for key, value in ns.items():
        if key.startswith("config_") and key not in ("config_set", "config_defaults") and value is not None:
            overrides[key[len("config_") :]] = value
    validation_split = ns.get("validation_split")
    if isinstance(validation_split, str) and validation_split.lower() in ("none", ""):
        validation_split = None
    known = {f.name for f in dataclasses.fields(TrainingArgs)}
    values = {k: v for k, v in ns.items() if k in known}
    values.update(overrides=overrides, validation_split=validation_split)
    if values.get("average_fraction", None) is _NOT_GIVEN:
        default = ns.get("default_average_fraction")
        values["average_fraction"] = default if values.get("average_last", 1) > 1 else None
    return TrainingArgs(**values)
