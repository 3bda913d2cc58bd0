"""The options of a training run (`TrainingArgs`) and what a run returns (`TrainingResult`).

Pure Python: the command line builds its flags from these defaults without
loading TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from keras_transformer.errors import ParameterError

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# "auto": the fastest of PRECISIONS on this machine (`keras_transformer.hardware.auto_precision`).
PRECISION_CHOICES = ("auto",) + PRECISIONS

# Options whose change would make a resumed run a different experiment: a
# resume with another value is refused (the model config is compared too).
RESUME_FIXED = (
    "data",
    "src",
    "tgt",
    "vocab_size",
    "subword_sampling",
    "batch_tokens",
    "accumulate_steps",
    "pad_to_multiple_of",
    "seed",
    "batch_multiple",
    "max_length",
    "warmup_steps",
    "lr_scale",
    "cooldown",
    "precision",
    "ema",
    "rdrop_alpha",
)
# What a run recorded without an option had: its value then, for the resume check.
RESUME_LEGACY_VALUES = {"pad_to_multiple_of": 8, "subword_sampling": 0.0, "accumulate_steps": 1, "rdrop_alpha": 0.0}


@dataclasses.dataclass
class TrainingArgs:
    """Everything `train` needs; the command line maps one flag to each field.

    Model:
        preset: "tiny", "mini", "small", "base" or "big" (`TransformerConfig` presets).
        overrides: `TransformerConfig` fields to change, e.g.
            `{"num_layers": 4, "dropout": 0.3}`.
        vocab_size: joint SentencePiece vocabulary size (§5.1).
        max_length: longest sequence in tokens (pairs with a longer side are
            dropped); default the config's `max_length` (256).
    Data:
        data: "multi30k", "tfds:NAME" or "files:SRC,TGT" (`data.load_dataset`).
        src, tgt: language codes.
        batch_tokens: global token budget per batch and side, padding included
            (§5.1 used ~25000 over 8 GPUs).
        accumulate_steps: batches per optimizer update (gradient
            accumulation, `training.accumulation`): K batches of
            `batch_tokens` make one update, that of one batch of K times the
            tokens, so the paper's batch fits on fewer devices. Steps
            (`max_steps`, `checkpoint_every`, the schedule's warmup, ...)
            count updates; an in-memory epoch is the whole updates of one
            pass (its last batches that make no whole update are left out).
            1 (default): an update per batch.
        pad_to_multiple_of: length buckets (each batch's padded length) are
            multiples of this (`data.default_bucket_boundaries`): 8 (default)
            gives few batch shapes; 1 gives buckets one or two tokens apart
            for short sentences, the least padding.
        validation_split: split used for validation ("val" for Multi30k,
            "validation" for tfds; "files:" paths must hold `{split}`, or
            the training files would be validated on); None for none.
        subword_sampling: subword regularization of the training pairs (not
            of validation): 0 for the best segmentation (the paper), else each
            pass segments every sentence at random, with this BPE-dropout
            probability (Provilkov et al., 2020: 0.1) or unigram smoothing
            alpha (`Tokenizer.tokenize`'s `sampling_alpha`).
    Schedule:
        epochs: passes over the training data (in-memory corpora) or epochs of
            `steps_per_epoch` steps (streamed corpora).
        max_steps: stop after this many optimizer steps (wins over `epochs`).
            With neither, 10 epochs.
        time_budget: stop, at the latest, once training has taken this many
            minutes (counted over all the processes of a resumed run, from
            their first step; the steps lost by an interruption are not
            counted twice). The stop is a checkpoint like any other. Not with
            MultiWorkerMirroredStrategy (each worker would stop at its own step).
        steps_per_epoch: steps per epoch for streamed (`tfds:`) corpora (a
            resumed run reads them with a new shuffle, not from the pair the
            interrupted one had reached: `training.stream`).
        warmup_steps, lr_scale: equation (3) of §5.3.
        cooldown: over this last fraction of the run the learning rate falls
            linearly to zero (`optimization.Cooldown`; not the paper's, whose
            rate only decays with equation (3)). The run's progress is its
            step over the last step, or with a time budget its training time
            over the budget, whichever is further. 0 (default): none.
        rdrop_alpha: R-Drop (`training.rdrop`; not in the paper): each batch
            runs twice under independent dropout masks and the loss adds
            alpha times the symmetric KL divergence of the two passes (5 in
            R-Drop's IWSLT14 recipe). An update costs two passes: halve
            `batch_tokens` to keep its cost. 0 (default): the paper's loss.
    Starting point:
        init_from: a run directory whose model configuration, vocabulary
            and weights this run starts from (fine-tuning, continued
            training; `training.init_from`).
        resume_optimizer: with `init_from`, also take its optimizer state
            and step (the schedule goes on) instead of a fresh optimizer.
    Run:
        output: run directory.
        precision: Keras dtype policy: "float32", "mixed_bfloat16" or
            "mixed_float16" (the latter with dynamic loss scaling: Keras wraps
            the optimizer in a `LossScaleOptimizer`), or "auto": mixed
            precision where the hardware computes in 16 bits, else float32
            (`keras_transformer.hardware.auto_precision`).
        xla: compile the train step with XLA (`jit_compile=True`).
        seed: seeds weights, dropout and the data order.
        checkpoint_every: steps between checkpoints (and resume points).
        checkpoint_minutes: also a checkpoint (and resume point) once this
            many minutes have passed since the last one, whatever the step
            count (the paper's checkpoints were "written at 10-minute
            intervals", §6.1), so that a slow machine loses at most these
            minutes to an interruption; None for steps only. Default 10.
            SIGINT and SIGTERM write one too before training stops.
        keep_checkpoints: newest checkpoints kept (at least `average_last`).
        average_last: average the last K checkpoints into the final model
            (§6.1: 5 for base, 20 for big); 0 or 1 keeps the last weights.
        average_fraction: None, or average only the checkpoints of the
            run's last fraction of steps (at most `average_last` of them;
            `training.averaging.checkpoints_to_average`): the same part of
            a run however many steps a time budget allows (not in the paper).
        ema: keep an exponential moving average of the weights with this
            decay (Keras' optimizer `use_ema`, `ema_momentum`), validate with
            it and make it the final model; an alternative to `average_last`
            (not in the paper). None for none.
        validate_every: epochs between validation runs.
        validate_bleu_every: steps between translations of the validation
            split scored with BLEU (and at the last step); None for none
            (`training.validation_bleu`).
        bleu_search: "greedy" or "beam" (beam 4, alpha 0.6) for those.
        keep_best: keep the weights of the best validation BLEU in
            `checkpoints/best.weights.h5`.
        early_stopping_patience: stop after this many BLEU validations
            without improvement; None never stops early.
        log_every: steps between rows of `steps.csv`.
        steps_per_execution: train steps per `tf.function` call.
        batch_multiple: round batch sizes to a multiple of this (default the
            replica count; it must be a multiple of the replica count); set it
            to compare runs on different device counts on the same batches.
        verbose: `fit` verbosity ("auto", 0, 1, 2).
    """

    output: str = "runs/run"
    data: str = "multi30k"
    src: str = "en"
    tgt: str = "de"
    preset: str = "small"
    overrides: dict = dataclasses.field(default_factory=dict)
    vocab_size: int = 8000
    max_length: int | None = None
    batch_tokens: int = 4096
    accumulate_steps: int = 1
    pad_to_multiple_of: int = 8
    validation_split: str | None = "val"
    subword_sampling: float = 0.0
    epochs: int | None = None
    max_steps: int | None = None
    steps_per_epoch: int | None = None
    time_budget: float | None = None
    warmup_steps: int = 4000
    lr_scale: float = 1.0
    cooldown: float = 0.0
    rdrop_alpha: float = 0.0
    precision: str = "float32"
    xla: bool = False
    seed: int = 0
    checkpoint_every: int = 1000
    checkpoint_minutes: float | None = 10.0
    keep_checkpoints: int = 5
    average_last: int = 0
    average_fraction: float | None = None
    ema: float | None = None
    validate_every: int = 1
    validate_bleu_every: int | None = None
    bleu_search: str = "greedy"
    keep_best: bool = False
    early_stopping_patience: int | None = None
    log_every: int = 10
    steps_per_execution: int = 1
    batch_multiple: int | None = None
    verbose: Any = "auto"
    init_from: str | None = None
    resume_optimizer: bool = False

    def __post_init__(self):
        if self.precision not in PRECISION_CHOICES:
            raise ParameterError("precision", f"must be one of {', '.join(PRECISION_CHOICES)}, got {self.precision!r}.")
        for name in ("time_budget", "checkpoint_minutes"):
            _check_minutes(name, getattr(self, name))
        for name in (
            "vocab_size",
            "batch_tokens",
            "accumulate_steps",
            "pad_to_multiple_of",
            "warmup_steps",
            "checkpoint_every",
            "validate_every",
            "log_every",
            "steps_per_execution",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ParameterError(name, f"must be a positive integer, got {value!r}.")
        if self.ema is not None and not (isinstance(self.ema, float) and 0.0 < self.ema < 1.0):
            raise ParameterError("ema", f"must be a decay between 0 and 1, got {self.ema!r}.")
        if self.ema is not None and self.average_last > 1:
            raise ParameterError("ema", "and average_last > 1 both choose the final weights: use one of them.")
        if self.resume_optimizer and not self.init_from:
            raise ParameterError("resume_optimizer", "needs init_from (the run directory to start from).")
        if self.init_from is not None and os.path.abspath(self.init_from) == os.path.abspath(self.output):
            raise ParameterError(
                "init_from", "is the run directory itself: to continue a run, run the same command again."
            )
        if self.bleu_search not in ("greedy", "beam"):
            raise ParameterError("bleu_search", f"must be 'greedy' or 'beam', got {self.bleu_search!r}.")
        if (self.keep_best or self.early_stopping_patience) and not self.validate_bleu_every:
            parameter = "keep_best" if self.keep_best else "early_stopping_patience"
            raise ParameterError(parameter, "needs validate_bleu_every (steps between validation BLEU scores).")
        if self.validate_bleu_every and not self.validation_split:
            raise ParameterError("validate_bleu_every", "needs a validation_split.")
        for name in (
            "epochs",
            "max_steps",
            "steps_per_epoch",
            "max_length",
            "batch_multiple",
            "validate_bleu_every",
            "early_stopping_patience",
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ParameterError(name, f"must be a positive integer or None, got {value!r}.")
        if self.keep_checkpoints < 1:
            raise ParameterError("keep_checkpoints", f"must be >= 1, got {self.keep_checkpoints!r}.")
        if self.average_last < 0:
            raise ParameterError("average_last", f"must be >= 0, got {self.average_last!r}.")
        if isinstance(self.subword_sampling, bool) or not 0.0 <= self.subword_sampling <= 1.0:
            raise ParameterError("subword_sampling", f"must be in [0, 1], got {self.subword_sampling!r}.")
        if self.average_fraction is not None and (
            isinstance(self.average_fraction, bool) or not 0.0 < self.average_fraction <= 1.0
        ):
            raise ParameterError(
                "average_fraction", f"must be a fraction of the run in (0, 1] or None, got {self.average_fraction!r}."
            )
        if self.average_fraction is not None and self.average_last <= 1:
            raise ParameterError(
                "average_fraction",
                f"({self.average_fraction!r}) chooses among the checkpoints that average_last > 1 averages, "
                f"and average_last is {self.average_last}: set average_last to K > 1, or average_fraction to None.",
            )
        if isinstance(self.cooldown, bool) or not 0.0 <= self.cooldown <= 1.0:
            raise ParameterError("cooldown", f"must be a fraction of the run in [0, 1], got {self.cooldown!r}.")
        if (
            isinstance(self.rdrop_alpha, bool)
            or not isinstance(self.rdrop_alpha, (int, float))
            or not self.rdrop_alpha >= 0
        ):
            raise ParameterError("rdrop_alpha", f"must be a number >= 0, got {self.rdrop_alpha!r}.")
        if not self.lr_scale > 0:
            raise ParameterError("lr_scale", f"must be positive, got {self.lr_scale!r}.")

    def model_config_overrides(self):
        """`overrides`, with `max_length` when it is set."""
        overrides = dict(self.overrides)
        if self.max_length is not None:
            overrides["max_length"] = self.max_length
        return overrides

    def model_config(self, vocab_size=None):
        """The `TransformerConfig` of the preset with the overrides (and `max_length`)."""
        from keras_transformer.config import TransformerConfig

        return TransformerConfig.from_preset(
            self.preset, vocab_size or self.vocab_size, **self.model_config_overrides()
        )

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def _check_minutes(name, value):
    """Refuses a duration in minutes that is not a positive number (None allowed)."""
    if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
        raise ParameterError(name, f"must be a positive number of minutes or None, got {value!r}.")


@dataclasses.dataclass
class TrainingResult:
    """What `train` returns.

    Attributes:
        run_dir: the run directory.
        model: the final float32 `Transformer` (averaged if asked), compiled.
        tokenizer: the run's `Tokenizer`.
        step: optimizer steps done.
        resumed_from: step the run resumed from (0 for a fresh run).
        history: per-epoch logs (`history.csv` rows, all epochs of the run).
        val_metrics: validation loss/accuracy of the final model (or None).
        tokens_per_sec: mean target tokens per second over this process's
            steps (compilation excluded).
        stopped_on_nan: training stopped because the loss became NaN.
        early_stopped: training stopped because validation BLEU stopped improving.
        val_bleu: `(step, BLEU)` of the last validation BLEU (or None).
        best_val_bleu: `(step, BLEU)` of the best one (or None).
        is_chief: whether this process is the chief worker (always, without
            MultiWorkerMirroredStrategy): only the chief should evaluate,
            export or write beside the run's files.
    """

    run_dir: str
    model: Any
    tokenizer: Any
    step: int
    resumed_from: int
    history: list
    val_metrics: dict | None
    tokens_per_sec: float | None
    stopped_on_nan: bool = False
    early_stopped: bool = False
    val_bleu: tuple | None = None
    best_val_bleu: tuple | None = None
    is_chief: bool = True
