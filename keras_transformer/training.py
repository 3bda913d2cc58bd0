"""Training with `model.fit` under `tf.distribute`: resumable, observable, reproducible.

The paper's training (Vaswani et al., 2017, §5):

- §5.1 batches of ~25000 source and ~25000 target tokens, sentence pairs
  batched by approximate length (`keras_transformer.data.make_batches`);
- §5.2 "We trained our models on one machine with 8 NVIDIA P100 GPUs [...]
  base models [...] for a total of 100,000 steps or 12 hours [...] big models
  were trained for 300,000 steps (3.5 days)": here, the strategy of
  `keras_transformer.distribute.get_strategy()` (one device, MirroredStrategy
  over the local GPUs, or MultiWorkerMirroredStrategy from `TF_CONFIG`), with
  the global batch split over the replicas and the loss divided by the global
  token count, so N replicas train exactly like one device;
- §5.3 Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the schedule of
  equation (3) with warmup_steps = 4000 (`--warmup-steps`, `--lr-scale`);
- §5.4 residual dropout P_drop = 0.1 and label smoothing epsilon_ls = 0.1;
- §6.1 "For the base models, we used a single model obtained by averaging the
  last 5 checkpoints, which were written at 10-minute intervals. For the big
  models, we averaged the last 20 checkpoints": `--checkpoint-every`,
  `--average-last K`, `average_checkpoints`.

Run directory (`--output`), everything needed to reproduce or continue a run::

    config.json      model TransformerConfig + training options + data spec
    spm.model        the SentencePiece vocabulary (reused if present)
    checkpoints/     ckpt-00001000.weights.h5 ...: model weights every
                     --checkpoint-every steps (the last --keep-checkpoints kept,
                     at least --average-last)
    backup/          full training state (model + optimizer) of the last
                     checkpoint, for resuming; written atomically
    logs/            TensorBoard (train/ and validation/)
    history.csv      one row per epoch (keras.callbacks.CSVLogger)
    steps.csv        loss, accuracy, learning rate and tokens/s every --log-every steps
    curves.png       training and validation loss/accuracy (written at the end)
    model.keras      the final model (averaged if --average-last > 1), float32

A run killed at any point (even SIGKILL) and started again with the same
command loads `backup/`, prints `resumed from step N` and continues: same
weights, optimizer moments, learning-rate step, and -- for corpora held in
memory (Multi30k, `files:`) -- the same batches in the same order as an
uninterrupted run. Streamed corpora (`tfds:`) are reshuffled with a
step-dependent seed on resume instead of replaying the stream.

An "epoch" (Keras `fit` epoch, one `history.csv` row) is one pass over an
in-memory training set: each pass is a new seeded permutation of the pairs,
batched by `make_batches` with the last partial batch of each length bucket
dropped, so every pass has the same number of batches. For streamed corpora
(tfds, and text files of more than `data.MAX_DEFAULT_POOL_SIZE` pairs) an
epoch is `--steps-per-epoch` steps (default 1000 for tfds). The row of an
epoch that was interrupted and resumed covers the steps after the resume.

Under MultiWorkerMirroredStrategy the chief writes the run directory and
worker i writes the same layout into `RUN_DIR/worker-i/`; every worker
resumes from the chief's `backup/` (a shared file system) or else its own.

Python API: `TrainingArgs`, `train(args)` -> `TrainingResult`,
`average_checkpoints(paths)`, `load_run(run_dir)`. Command line:
`keras-transformer train ...` and `keras-transformer average-checkpoints RUN_DIR --last K`.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import json
import logging
import math
import os
import re
import time
import warnings
from typing import Any, Optional, Sequence

import numpy as np

logger = logging.getLogger(__name__)

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
# "auto": the fastest of PRECISIONS on this machine (`distribute.auto_precision`).
PRECISION_CHOICES = ("auto",) + PRECISIONS

CONFIG_FILENAME = "config.json"
MODEL_FILENAME = "model.keras"
HISTORY_FILENAME = "history.csv"
STEPS_FILENAME = "steps.csv"
CURVES_FILENAME = "curves.png"
CHECKPOINT_DIR = "checkpoints"
BACKUP_DIR = "backup"
LOG_DIR = "logs"

_CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.weights\.h5$")

# Options whose change would make a resumed run a different experiment.
_RESUME_FIXED = ("data", "src", "tgt", "vocab_size", "batch_tokens", "seed", "batch_multiple", "max_length")

__all__ = [
    "TrainingArgs",
    "TrainingResult",
    "train",
    "average_checkpoints",
    "list_checkpoints",
    "load_run",
    "write_averaged_model",
    "register_commands",
]


# ----------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainingArgs:
    """Everything `train` needs; the command line maps one flag to each field.

    Model:
        preset: "tiny", "small", "base" or "big" (`TransformerConfig` presets).
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
        validation_split: split used for validation ("val" for Multi30k,
            "validation" for tfds); None for none.
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
        steps_per_epoch: steps per epoch for streamed (`tfds:`) corpora.
        warmup_steps, lr_scale: equation (3) of §5.3.
    Run:
        output: run directory.
        precision: Keras dtype policy: "float32", "mixed_bfloat16" or
            "mixed_float16" (the latter with dynamic loss scaling: Keras wraps
            the optimizer in a `LossScaleOptimizer`), or "auto": mixed
            precision where the hardware computes in 16 bits, else float32
            (`distribute.auto_precision`).
        xla: compile the train step with XLA (`jit_compile=True`).
        seed: seeds weights, dropout and the data order.
        checkpoint_every: steps between checkpoints (and resume points).
        keep_checkpoints: newest checkpoints kept (at least `average_last`).
        average_last: average the last K checkpoints into the final model
            (§6.1: 5 for base, 20 for big); 0 or 1 keeps the last weights.
        validate_every: epochs between validation runs.
        log_every: steps between rows of `steps.csv`.
        steps_per_execution: train steps per `tf.function` call.
        batch_multiple: round batch sizes to a multiple of this (default the
            replica count); set it to compare runs on different device counts
            on the same batches.
        verbose: `fit` verbosity ("auto", 0, 1, 2).
    """

    output: str = "runs/run"
    data: str = "multi30k"
    src: str = "en"
    tgt: str = "de"
    preset: str = "small"
    overrides: dict = dataclasses.field(default_factory=dict)
    vocab_size: int = 8000
    max_length: Optional[int] = None
    batch_tokens: int = 4096
    validation_split: Optional[str] = "val"
    epochs: Optional[int] = None
    max_steps: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    time_budget: Optional[float] = None
    warmup_steps: int = 4000
    lr_scale: float = 1.0
    precision: str = "float32"
    xla: bool = False
    seed: int = 0
    checkpoint_every: int = 1000
    keep_checkpoints: int = 5
    average_last: int = 0
    validate_every: int = 1
    log_every: int = 10
    steps_per_execution: int = 1
    batch_multiple: Optional[int] = None
    verbose: Any = "auto"

    def __post_init__(self):
        if self.precision not in PRECISION_CHOICES:
            raise ValueError(f"precision must be one of {', '.join(PRECISION_CHOICES)}, got {self.precision!r}.")
        if self.time_budget is not None and not (
            isinstance(self.time_budget, (int, float)) and not isinstance(self.time_budget, bool)
            and self.time_budget > 0
        ):
            raise ValueError(f"time_budget must be a positive number of minutes or None, got {self.time_budget!r}.")
        for name in ("vocab_size", "batch_tokens", "warmup_steps", "checkpoint_every", "validate_every",
                     "log_every", "steps_per_execution"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        for name in ("epochs", "max_steps", "steps_per_epoch", "max_length", "batch_multiple"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}.")
        if self.keep_checkpoints < 1 or self.average_last < 0:
            raise ValueError("keep_checkpoints must be >= 1 and average_last >= 0.")
        if not self.lr_scale > 0:
            raise ValueError(f"lr_scale must be positive, got {self.lr_scale!r}.")

    def model_config(self, vocab_size=None):
        """The `TransformerConfig` of the preset with the overrides (and `max_length`)."""
        from keras_transformer.config import TransformerConfig

        overrides = dict(self.overrides)
        if self.max_length is not None:
            overrides["max_length"] = self.max_length
        return TransformerConfig.from_preset(self.preset, vocab_size or self.vocab_size, **overrides)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


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
    """

    run_dir: str
    model: Any
    tokenizer: Any
    step: int
    resumed_from: int
    history: list
    val_metrics: Optional[dict]
    tokens_per_sec: Optional[float]
    stopped_on_nan: bool = False


# ----------------------------------------------------------------------------------
# Small pieces
# ----------------------------------------------------------------------------------


def _atomic_write_text(path, text):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_model_weights(model, path):
    """Model weights only (no optimizer) to a `.weights.h5`, atomically."""
    tmp = os.path.join(os.path.dirname(path), f"tmp-{os.getpid()}-{os.path.basename(path)}")
    try:
        from keras.src.saving import saving_lib

        saving_lib.save_weights_only(model, tmp, objects_to_skip=[model.optimizer] if model.optimizer else None)
    except (ImportError, TypeError, AttributeError):  # private API moved: save everything
        model.save_weights(tmp)
    os.replace(tmp, path)


def list_checkpoints(run_dir_or_checkpoint_dir):
    """Checkpoint paths of a run (or a `checkpoints/` directory), oldest first, as (step, path)."""
    directory = run_dir_or_checkpoint_dir
    if os.path.isdir(os.path.join(directory, CHECKPOINT_DIR)):
        directory = os.path.join(directory, CHECKPOINT_DIR)
    found = []
    for path in glob.glob(os.path.join(directory, "ckpt-*.weights.h5")):
        match = _CHECKPOINT_RE.search(os.path.basename(path))
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _read_config(run_dir):
    with open(os.path.join(run_dir, CONFIG_FILENAME), encoding="utf-8") as f:
        return json.load(f)


def _model_config_of_run(run_dir):
    from keras_transformer.config import TransformerConfig

    return TransformerConfig.from_dict(_read_config(run_dir)["model"])


def _build_model(config, dtype=None):
    from keras_transformer.model import Transformer

    model = Transformer(config, dtype=dtype) if dtype else Transformer(config)
    model.build()
    return model


def _run_dir_of_checkpoint(path):
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(directory) == CHECKPOINT_DIR:
        directory = os.path.dirname(directory)
    return directory


def average_checkpoints(paths, model=None):
    """Element-wise mean of the weights of several checkpoints (§6.1 checkpoint averaging).

    "For the base models, we used a single model obtained by averaging the last
    5 checkpoints [...] For the big models, we averaged the last 20" (§6.1).

    Args:
        paths: `.weights.h5` checkpoint files of the same model.
        model: a built model to load them into; default a float32
            `Transformer` built from the `config.json` of the run the first
            checkpoint belongs to.

    Returns:
        list of NumPy arrays in `model.get_weights()` order (pass it to
        `model.set_weights`), each the mean over the checkpoints (accumulated in
        float64, returned in the weights' dtype).
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path.")
    if model is None:
        model = _build_model(_model_config_of_run(_run_dir_of_checkpoint(paths[0])), dtype="float32")
    original = model.get_weights()
    total = None
    try:
        for path in paths:
            model.load_weights(path)
            weights = model.get_weights()
            if total is None:
                total = [w.astype(np.float64) for w in weights]
            else:
                for acc, w in zip(total, weights):
                    acc += w
    finally:
        model.set_weights(original)
    return [(acc / len(paths)).astype(w.dtype) for acc, w in zip(total, original)]


def write_averaged_model(run_dir, last, output=None):
    """Averages the last `last` checkpoints of `run_dir` into a compiled float32 model file.

    Args:
        run_dir: run directory.
        last: K, the number of newest checkpoints to average.
        output: `.keras` (whole model) or `.weights.h5` path; default
            `RUN_DIR/model-avg{K}.keras`.

    Returns:
        (output path, list of averaged checkpoint paths).
    """
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"No checkpoints in {os.path.join(run_dir, CHECKPOINT_DIR)}.")
    if last < 1:
        raise ValueError(f"--last must be >= 1, got {last}.")
    if len(checkpoints) < last:
        logger.warning("%s has %d checkpoints, fewer than --last %d; averaging all of them.",
                       run_dir, len(checkpoints), last)
    chosen = [p for _, p in checkpoints[-last:]]
    model = _build_model(_model_config_of_run(run_dir), dtype="float32")
    model.set_weights(average_checkpoints(chosen, model))
    output = output or os.path.join(run_dir, f"model-avg{len(chosen)}.keras")
    if output.endswith(".weights.h5"):
        model.save_weights(output)
    else:
        model.compile()
        model.save(output)
    return output, chosen


def load_run(run_dir, checkpoint=None, dtype=None):
    """The model and tokenizer of a run directory: `(Transformer, Tokenizer)`.

    Loads `model.keras` when the run has finished; otherwise (or with
    `checkpoint`, a path or "latest") the config and a checkpoint's weights.
    `dtype`: a dtype policy for the returned model ("float32",
    "mixed_bfloat16", ...); default: `model.keras`'s own (the training
    precision), float32 for a checkpoint.
    """
    import keras

    from keras_transformer.tokenizer import Tokenizer

    tokenizer = Tokenizer(os.path.join(run_dir, "spm.model"))
    final = os.path.join(run_dir, MODEL_FILENAME)
    if checkpoint is None and os.path.exists(final):
        # compile=False then compile(): the saved optimizer is unbuilt, and loading it
        # into the built one of Transformer.compile_from_config only warns.
        model = keras.saving.load_model(final, compile=False)
        if dtype is not None and keras.dtype_policies.get(dtype).name != model.dtype_policy.name:
            weights = model.get_weights()
            model = _build_model(model.config, dtype=dtype)
            model.set_weights(weights)
        model.compile()
        return model, tokenizer
    checkpoints = list_checkpoints(run_dir)
    if checkpoint in (None, "latest"):
        if not checkpoints:
            raise FileNotFoundError(f"{run_dir} has neither {MODEL_FILENAME} nor checkpoints.")
        checkpoint = checkpoints[-1][1]
    model = _build_model(_model_config_of_run(run_dir), dtype=dtype or "float32")
    model.load_weights(checkpoint)
    model.compile()
    return model, tokenizer


def _strategy_worker(strategy):
    """(is_chief, worker_index) for this process under `strategy`."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not getattr(resolver, "task_type", None):
        return True, 0
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    cluster = resolver.cluster_spec().as_dict()
    if task_type == "chief":
        return True, 0
    if task_type == "worker" and task_id == 0 and "chief" not in cluster:
        return True, 0
    offset = 1 if "chief" in cluster else 0
    return False, task_id + offset


# ----------------------------------------------------------------------------------
# Metrics and callbacks
# ----------------------------------------------------------------------------------


def _make_count_metrics():
    """Two `Sum` metrics: target tokens (labels != pad) and sequences, summed over replicas."""
    import keras
    from keras import ops

    class TargetTokens(keras.metrics.Sum):
        def update_state(self, y_true, y_pred, sample_weight=None):
            return super().update_state(ops.sum(ops.cast(ops.not_equal(y_true, 0), "float32")))

    class Sequences(keras.metrics.Sum):
        def update_state(self, y_true, y_pred, sample_weight=None):
            return super().update_state(ops.cast(ops.shape(y_true)[0], "float32"))

    return [TargetTokens(name="tokens"), Sequences(name="sequences")]


def _current_learning_rate(optimizer, iterations=None):
    """Learning rate of the update just applied (step `iterations - 1`)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = inner._learning_rate
    if iterations is None:
        iterations = int(inner.iterations.numpy())
    if callable(schedule) and not hasattr(schedule, "numpy"):
        return float(np.asarray(schedule(max(iterations - 1, 0))))
    return float(np.asarray(inner.learning_rate))


def _make_monitor_class():
    import keras

    class RunMonitor(keras.callbacks.Callback):
        """Step counting, checkpoints, the stop at the last step, and what the run shows.

        - Puts `learning_rate` and `tokens_per_sec` (target tokens per second)
          into the batch logs, so the progress bar shows them next to loss
          and accuracy, and `step`, `learning_rate`, `tokens_per_sec`,
          `elapsed` into the epoch logs (history.csv, TensorBoard).
        - Every `log_every` steps appends to `steps.csv` the loss and accuracy
          of those steps (Keras logs running means since the epoch began,
          the loss weighted by sequences and the accuracy by tokens, which the
          `sequences` and `tokens` metrics give, so differences of the running
          sums are exact window means).
        - Every `checkpoint_every` steps writes a checkpoint and the backup
          (and `epoch_end_backup()` the backup at each epoch end).
        - Stops training at `total_steps`, or once the run's training time
          reaches `--time-budget`, with a checkpoint at that step.
        """

        def __init__(self, run, start_step, total_steps):
            super().__init__()
            self.run = run
            self.step = start_step
            self.total_steps = total_steps
            self.stopped_on_nan = False
            self.out_of_time = False
            self.last_backup = start_step
            self.last_validation = None
            self.timed_tokens = 0.0
            self.timed_seconds = 0.0
            self._speed = None

        def on_train_begin(self, logs=None):
            if self.run.train_start is None:
                self.run.train_start = time.perf_counter()

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch_start_step = self.step
            self._first = None  # (time, tokens) at the end of the epoch's first call
            self._last = None
            self._speed_ref = None
            self._window = (0.0, 0.0, 0.0, 0.0)  # sequences, loss sum, tokens, correct

        def on_train_batch_end(self, batch, logs=None):
            logs = logs if logs is not None else {}
            now = time.perf_counter()
            previous, self.step = self.step, self._epoch_start_step + batch + 1
            if self.model.distribute_strategy.num_replicas_in_sync > 1:
                # Keras logs the mean (or first) of the replicas' own metric values;
                # read the metrics across replicas instead: exact global values.
                logs.update({k: float(np.asarray(v).reshape(-1)[0])
                             for k, v in self.model.get_metrics_result().items()})
            tokens = float(logs.pop("tokens", 0.0))
            sequences = float(logs.pop("sequences", 0.0))
            loss = float(logs.get("loss", float("nan")))
            if not math.isfinite(loss):
                self.stopped_on_nan = True
            # Speed from the end of the first call of the epoch on (that one includes tracing).
            if self._first is None:
                self._first = self._speed_ref = (now, tokens)
            else:
                self.timed_seconds += now - self._last[0]
                self.timed_tokens += tokens - self._last[1]
                elapsed = now - self._speed_ref[0]
                if elapsed > 0:
                    self._speed = (tokens - self._speed_ref[1]) / elapsed
                if elapsed > 10.0:  # a sliding reference keeps the shown rate current
                    self._speed_ref = (now, tokens)
            self._last = (now, tokens)
            lr = _current_learning_rate(self.model.optimizer)
            logs["learning_rate"] = lr
            if self._speed is not None:
                logs["tokens_per_sec"] = self._speed
            args = self.run.args
            self.out_of_time = self.out_of_time or self.run.out_of_time()
            last = self.step >= self.total_steps or self.out_of_time
            if self.run.is_chief and (self._crossed(previous, args.log_every) or last):
                self._log_step(loss, float(logs.get("accuracy", float("nan"))), sequences, tokens, lr)
            if not self.stopped_on_nan and (self._crossed(previous, args.checkpoint_every) or last):
                self.run.save_checkpoint(self.model, self.step)
                self.last_backup = self.step
            if last:
                self.model.stop_training = True

        def _crossed(self, previous, every):
            return self.step // every > previous // every

        def _log_step(self, loss, accuracy, sequences, tokens, lr):
            seqs0, loss_sum0, tokens0, correct0 = self._window
            loss_sum, correct = loss * sequences, accuracy * tokens
            window_loss = (loss_sum - loss_sum0) / (sequences - seqs0) if sequences > seqs0 else loss
            window_acc = (correct - correct0) / (tokens - tokens0) if tokens > tokens0 else accuracy
            self._window = (sequences, loss_sum, tokens, correct)
            self.run.append_step_row(dict(
                step=self.step,
                epoch=self.run.epoch_of(self.step),
                loss=round(window_loss, 6),
                accuracy=round(window_acc, 6),
                learning_rate=lr,
                tokens_per_sec=round(self._speed, 1) if self._speed is not None else "",
                elapsed_sec=round(time.perf_counter() - self.run.start_time, 2),
            ))

        def on_epoch_end(self, epoch, logs=None):
            logs = logs if logs is not None else {}
            logs["step"] = self.step
            logs["learning_rate"] = _current_learning_rate(self.model.optimizer)
            if self._first is not None and self._last[0] > self._first[0]:
                logs["tokens_per_sec"] = (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
            logs["elapsed"] = time.perf_counter() - self.run.start_time
            for key in ("val_tokens", "val_sequences"):
                logs.pop(key, None)
            if "val_loss" in logs:
                self.last_validation = (self.step, {k: float(logs[f"val_{k}"]) for k in ("loss", "accuracy")
                                                    if f"val_{k}" in logs})

        def epoch_end_backup(self):
            """A callback for the end of the list: a resume point at every epoch end,
            written after the epoch's history.csv row (a resumed run redoes the rows
            of epochs that are not complete)."""
            monitor = self

            class EpochEndBackup(keras.callbacks.Callback):
                def on_epoch_end(self, epoch, logs=None):
                    if not monitor.stopped_on_nan and monitor.step != monitor.last_backup:
                        monitor.run.save_backup(self.model, monitor.step)
                        monitor.last_backup = monitor.step

            return EpochEndBackup()

        def on_test_batch_end(self, batch, logs=None):
            if logs is not None:
                logs.pop("tokens", None)
                logs.pop("sequences", None)

    return RunMonitor


# ----------------------------------------------------------------------------------
# The run
# ----------------------------------------------------------------------------------


class _Run:
    """State of one training process: directories, chief or not, data stream, checkpoints."""

    def __init__(self, args, strategy):
        self.args = args
        self.strategy = strategy
        self.is_chief, self.worker_index = _strategy_worker(strategy)
        self.run_dir = os.path.abspath(args.output)
        # Non-chief workers write into their own subdirectory (same layout).
        self.out_dir = self.run_dir if self.is_chief else os.path.join(self.run_dir, f"worker-{self.worker_index}")
        self.start_time = time.perf_counter()
        self.steps_per_epoch = None
        self.trained_seconds = 0.0  # training time of the run's earlier processes (from the backup)
        self.train_start = None  # when this process began training
        os.makedirs(self.out_dir, exist_ok=True)
        os.makedirs(os.path.join(self.out_dir, CHECKPOINT_DIR), exist_ok=True)

    def training_seconds(self):
        """Training time of the run so far: earlier processes up to the backup, plus this one's."""
        if self.train_start is None:
            return self.trained_seconds
        return self.trained_seconds + time.perf_counter() - self.train_start

    def out_of_time(self):
        """Whether the run has used up its `--time-budget` (never without one)."""
        budget = self.args.time_budget
        return budget is not None and self.training_seconds() >= 60.0 * budget

    def path(self, *parts):
        return os.path.join(self.out_dir, *parts)

    def epoch_of(self, step):
        return (step - 1) // self.steps_per_epoch if step > 0 else 0

    # -- checkpoints ----------------------------------------------------------
    def save_checkpoint(self, model, step):
        """Backup (full state) first, then the model-only checkpoint."""
        self.save_backup(model, step)
        _save_model_weights(model, self.path(CHECKPOINT_DIR, f"ckpt-{step:08d}.weights.h5"))
        keep = max(self.args.keep_checkpoints, self.args.average_last)
        for _, old in list_checkpoints(self.out_dir)[:-keep]:
            try:
                os.remove(old)
            except FileNotFoundError:
                pass

    def save_backup(self, model, step):
        backup = self.path(BACKUP_DIR)
        os.makedirs(backup, exist_ok=True)
        name = f"state-{step:08d}.weights.h5"
        tmp = os.path.join(backup, f"tmp-{os.getpid()}-{name}")
        model.save_weights(tmp)
        os.replace(tmp, os.path.join(backup, name))
        _atomic_write_text(os.path.join(backup, "state.json"), json.dumps(
            {"step": step, "weights": name, "training_seconds": round(self.training_seconds(), 3)}, indent=2))
        for old in glob.glob(os.path.join(backup, "state-*.weights.h5")) + glob.glob(os.path.join(backup, "tmp-*")):
            if os.path.basename(old) != name:
                try:
                    os.remove(old)
                except FileNotFoundError:
                    pass

    def find_backup(self):
        """(step, weights path, training seconds) of the resume point, or None. Workers prefer the chief's."""
        candidates = [os.path.join(self.run_dir, BACKUP_DIR)]
        if not self.is_chief:
            candidates.append(self.path(BACKUP_DIR))
        for backup in candidates:
            state_path = os.path.join(backup, "state.json")
            if os.path.exists(state_path):
                with open(state_path, encoding="utf-8") as f:
                    state = json.load(f)
                weights = os.path.join(backup, state["weights"])
                if os.path.exists(weights):
                    return int(state["step"]), weights, float(state.get("training_seconds", 0.0))
        return None

    # -- logs -----------------------------------------------------------------
    def append_step_row(self, row):
        path = self.path(STEPS_FILENAME)
        new = not os.path.exists(path) or os.path.getsize(path) == 0
        with open(path, "a", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(row))
            if new:
                writer.writeheader()
            writer.writerow(row)

    def truncate_logs(self, step):
        """Drops rows written after `step` by an interrupted run (they will be redone)."""
        epoch = step // self.steps_per_epoch
        _filter_csv(self.path(HISTORY_FILENAME), lambda row: int(row["epoch"]) < epoch)
        _filter_csv(self.path(STEPS_FILENAME), lambda row: int(row["step"]) <= step)


def _filter_csv(path, keep):
    if not os.path.exists(path):
        return
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
        fieldnames = None
        f.seek(0)
        header = f.readline()
        if header.strip():
            fieldnames = next(csv.reader([header]))
    if fieldnames is None:
        return
    kept = [r for r in rows if _safe(keep, r)]
    if len(kept) == len(rows):
        return
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(tmp, path)


def _safe(keep, row):
    try:
        return keep(row)
    except (KeyError, TypeError, ValueError):
        return False


def _read_csv(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _float(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def plot_curves(run_dir, output=None):
    """Writes `curves.png`: training (every `log_every` steps) and validation (every epoch)
    loss and accuracy against the step. Returns the path, or None without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = _read_csv(os.path.join(run_dir, STEPS_FILENAME))
    epochs = _read_csv(os.path.join(run_dir, HISTORY_FILENAME))
    if not steps and not epochs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "loss", "label-smoothed cross-entropy"), (axes[1], "accuracy", "token accuracy")):
        xs = [_float(r.get("step")) for r in steps]
        ys = [_float(r.get(key)) for r in steps]
        points = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if points:
            ax.plot(*zip(*points), label="train (mean of each --log-every steps)", color="tab:blue", linewidth=1)
        for prefix, label, style in (("", "train (epoch mean)", dict(color="tab:blue", marker="o", linestyle="none",
                                                                         alpha=0.5)),
                                     ("val_", "validation", dict(color="tab:orange", marker="o"))):
            pts = [(_float(r.get("step")), _float(r.get(prefix + key))) for r in epochs]
            pts = [(x, y) for x, y in pts if x is not None and y is not None]
            if pts:
                ax.plot(*zip(*pts), label=label, **style)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    output = output or os.path.join(run_dir, CURVES_FILENAME)
    tmp = output + f".tmp-{os.getpid()}.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, output)
    return output


# ----------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------


def _materialize(dataset):
    """A `(source_text, target_text)` dataset as two `tf.string` tensors."""
    import tensorflow as tf

    sources, targets = [], []
    for src, tgt in dataset.batch(65536):
        sources.append(src)
        targets.append(tgt)
    if not sources:
        raise ValueError("The training data is empty.")
    return tf.concat(sources, 0), tf.concat(targets, 0)


def count_batches_per_epoch(pairs, tokenizer, batch_tokens, max_length, num_replicas):
    """Batches `make_batches(..., drop_remainder=True)` yields for one pass over these pairs.

    With the remainder dropped, this is `sum_k n_k // size_k` over the length
    buckets k (n_k pairs of bucket k, size_k sentences per batch), whatever the
    order of the pairs: every shuffled pass has this many batches.
    """
    from keras_transformer import data

    boundaries = data.default_bucket_boundaries(max_length)
    sizes = data.bucket_batch_sizes(boundaries, batch_tokens, num_replicas)
    src, tgt = pairs
    counts = np.zeros(len(boundaries), np.int64)
    chunk = 8192
    for start in range(0, int(src.shape[0]), chunk):
        s_len = tokenizer.tokenize(src[start:start + chunk]).row_lengths().numpy() + 1
        t_len = tokenizer.tokenize(tgt[start:start + chunk]).row_lengths().numpy() + 1
        fits = (s_len <= max_length) & (t_len <= max_length)
        length = np.maximum(s_len, t_len)[fits]
        bucket = np.searchsorted(np.asarray(boundaries), length, side="left")
        counts += np.bincount(bucket, minlength=len(boundaries))
    return int(sum(n // size for n, size in zip(counts, sizes)))


class _TrainingData:
    """The deterministic stream of training batches and where step N is in it."""

    def __init__(self, args, tokenizer, text, num_replicas, max_length):
        import tensorflow as tf

        from keras_transformer import data

        self.args = args
        self.tokenizer = tokenizer
        self.num_replicas = num_replicas
        self.max_length = max_length
        self.options = tf.data.Options()
        # Every worker builds the same global batches and keeps its replicas' slices.
        self.options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        self.text = text
        self.tensors = None
        self.streamed = args.data.startswith("tfds:")
        if not self.streamed:
            self.tensors = _materialize(text)
            self.num_pairs = int(self.tensors[0].shape[0])
            # One length-sorting pool per pass needs the pass in memory: beyond
            # make_batches' largest default pool, stream (and reseed on resume) instead.
            if self.num_pairs > data.MAX_DEFAULT_POOL_SIZE:
                self.streamed = True

    def batches_per_epoch(self):
        if self.streamed and (self.args.steps_per_epoch or self.tensors is None):
            return self.args.steps_per_epoch or 1000
        # Exact for in-memory passes; for a large in-memory corpus streamed in
        # several pools, close (a few partial batches per pool are dropped).
        return count_batches_per_epoch(self.tensors, self.tokenizer, self.args.batch_tokens,
                                       self.max_length, self.num_replicas)

    def _epoch_batches(self, epoch):
        import tensorflow as tf

        from keras_transformer import data

        src, tgt = self.tensors
        seed = tf.stack([tf.constant(self.args.seed, tf.int64), tf.cast(epoch, tf.int64)])
        order = tf.argsort(tf.random.stateless_uniform(tf.shape(src), seed=seed))
        pairs = tf.data.Dataset.from_tensor_slices((tf.gather(src, order), tf.gather(tgt, order)))
        # One pool per pass: every pass has exactly sum_k n_k // size_k batches.
        return data.make_batches(
            pairs, self.tokenizer, batch_tokens=self.args.batch_tokens, max_length=self.max_length,
            shuffle=False, num_replicas=self.num_replicas, drop_remainder=True, pool_size=self.num_pairs,
        )

    def stream(self, start_step, steps_per_epoch):
        """Batches from global step `start_step` on (infinite)."""
        import tensorflow as tf

        from keras_transformer import data

        if self.streamed:
            # Streamed corpora: a resumed run reshuffles (seed + step) instead of replaying.
            dataset = data.make_batches(
                self.text, self.tokenizer, batch_tokens=self.args.batch_tokens, max_length=self.max_length,
                shuffle=True, seed=self.args.seed + start_step, num_replicas=self.num_replicas,
                repeat=True, drop_remainder=True,
            )
        else:
            first_epoch, skip = divmod(start_step, steps_per_epoch)
            dataset = tf.data.Dataset.range(first_epoch, 2**62).flat_map(self._epoch_batches)
            if skip:
                dataset = dataset.skip(skip)
            dataset = dataset.prefetch(tf.data.AUTOTUNE)
        return dataset.with_options(self.options)

    def validation(self, text):
        """The validation batches, tokenized and batched once and held in memory.

        Keras drops its validation iterator before every evaluation; dropping
        a live pipeline (tokenizer, parallel map, bucketing) blocked `fit` for
        30-60 s at some epoch ends on a 2-core CPU. A dataset of ready tensors
        has nothing to wind down, and a known length.
        """
        import functools

        import tensorflow as tf

        from keras_transformer import data

        dataset = data.make_batches(
            text, self.tokenizer, batch_tokens=self.args.batch_tokens, max_length=self.max_length,
            shuffle=False, num_replicas=self.num_replicas, drop_remainder=False,
        )
        batches = [tf.data.Dataset.from_tensors(batch) for batch in dataset]
        if not batches:
            raise ValueError("The validation split has no sentence pairs within max_length.")
        dataset = functools.reduce(lambda a, b: a.concatenate(b), batches)
        return dataset.with_options(self.options)


def _training_texts(args):
    """Zero-argument function giving source + target training sentences (for the vocabulary)."""

    def texts():
        from keras_transformer import data

        if args.data == "multi30k":
            from keras_transformer import datasets

            return datasets.read_lines("train", args.src) + datasets.read_lines("train", args.tgt)
        dataset = data.load_dataset(args.data, "train", args.src, args.tgt)
        if args.data.startswith("tfds:"):
            dataset = dataset.take(1_000_000)  # 2M sentences: enough text for a BPE vocabulary
        sources, targets = [], []
        for src, tgt in dataset.batch(65536).as_numpy_iterator():
            sources.extend(s.decode("utf-8") for s in src)
            targets.extend(t.decode("utf-8") for t in tgt)
        return sources + targets

    return texts


# ----------------------------------------------------------------------------------
# train()
# ----------------------------------------------------------------------------------


def _tensorboard_available():
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


def _tensorboard(log_dir, update_freq, monitor):
    """`keras.callbacks.TensorBoard` whose batch-level step axis is the global step,
    also after a resume (Keras restarts it at 0 in every `fit`)."""
    import keras

    class TensorBoard(keras.callbacks.TensorBoard):
        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            self._global_train_batch = monitor.step

    return TensorBoard(log_dir, update_freq=update_freq, write_graph=False)


def _csv_logger(path, with_validation):
    """`keras.callbacks.CSVLogger` (appending, for resumed runs) with fixed columns:
    the training logs, then `val_loss` and `val_accuracy` when there is validation."""
    import keras

    class CSVLogger(keras.callbacks.CSVLogger):
        def on_epoch_end(self, epoch, logs=None):
            if self.keys is None and logs:
                train_keys = sorted(k for k in logs if not k.startswith("val_"))
                self.keys = train_keys + (["val_accuracy", "val_loss"] if with_validation else [])
            super().on_epoch_end(epoch, logs)

    return CSVLogger(path, append=True)


def _work_around_keras_multiworker(model, strategy, element_spec):
    """Makes Keras 3 `fit`/`evaluate` run under MultiWorkerMirroredStrategy.

    Two Keras 3 bugs (seen up to 3.15; keras-team/keras#20585) break `fit`
    with MultiWorkerMirroredStrategy:

    1. Before training, Keras takes a batch from the distributed dataset and
       `strategy.reduce`s it to build the compiled loss and metrics, which
       fails on nested inputs ("Attempt to convert a value (PerReplica...) to
       a Tensor"). The build only needs shapes and dtypes: build from the
       dataset's `element_spec` under the scope and skip Keras's attempt.
    2. The step's metric results are reduced with
       `strategy.reduce("MEAN", value, axis=0)`, which fails on the scalar
       results ("Invalid reduction dimension 0 for input with 0 dimensions").
       The steps here return them with shape [1] instead; the monitor then
       replaces the logged values by the exact cross-replica metric results.
    """
    from keras import ops

    with strategy.scope():
        model._symbolic_build(data_batch=element_spec)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None

    def as_vectors(step):
        def wrapped(data):
            return {name: ops.reshape(value, [1]) for name, value in step(data).items()}

        return wrapped

    model.train_step = as_vectors(model.train_step)
    model.test_step = as_vectors(model.test_step)


def _fit_plan(step, total_steps, steps_per_epoch):
    """`fit` calls `(initial_epoch, epochs, steps_per_epoch)` from `step` to `total_steps`.

    Keras epochs have a fixed number of steps, so a run resumed inside an epoch
    first finishes that epoch in a `fit` call of its own; a last, partial epoch
    is cut by the monitor's stop at `total_steps`.
    """
    plan = []
    epoch, into = divmod(step, steps_per_epoch)
    if into:
        left = min(steps_per_epoch - into, total_steps - step)
        plan.append((epoch, epoch + 1, left))
        step += left
        epoch += 1
    if step < total_steps:
        last_epoch = math.ceil(total_steps / steps_per_epoch)
        per_epoch = steps_per_epoch if last_epoch - epoch > 1 else total_steps - step
        plan.append((epoch, last_epoch, per_epoch))
    return plan


def _check_time_budget(args, strategy):
    """Workers timing themselves would stop at different steps and leave the others waiting."""
    import tensorflow as tf

    if args.time_budget is not None and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise ValueError("--time-budget is not supported with MultiWorkerMirroredStrategy (TF_CONFIG): each "
                         "worker would stop at its own step. Use --max-steps or --epochs.")


def _validation_split(args):
    split = args.validation_split
    if args.data.startswith("tfds:") and split == "val":
        return "validation"
    return split


def _check_resume_config(run_dir, args, model_config):
    """Refuses to continue a run with a different model, data or batching."""
    path = os.path.join(run_dir, CONFIG_FILENAME)
    if not os.path.exists(path):
        return None
    saved = _read_config(run_dir)
    problems = []
    if saved.get("model") != model_config.to_dict():
        changed = sorted(k for k in set(saved.get("model", {})) | set(model_config.to_dict())
                         if saved.get("model", {}).get(k) != model_config.to_dict().get(k))
        problems.append(f"model config ({', '.join(changed)})")
    saved_training = saved.get("training", {})
    for key in _RESUME_FIXED:
        if key in saved_training and saved_training[key] != getattr(args, key):
            problems.append(f"{key} ({saved_training[key]!r} -> {getattr(args, key)!r})")
    if problems:
        raise ValueError(
            f"{run_dir} holds a run with a different {'; '.join(problems)}. Use the same options to "
            "continue it, or another --output directory."
        )
    return saved


def train(args: TrainingArgs, callbacks: Sequence = (), strategy=None) -> TrainingResult:
    """Trains (or continues) the run in `args.output` with `model.fit`.

    Steps: strategy (`distribute.get_strategy()`, created first because
    MultiWorkerMirroredStrategy must be set up before TensorFlow starts), dtype
    policy, run directory and vocabulary (`spm.model`, reused if present), the
    model/optimizer/metrics under `strategy.scope()`, resume from `backup/` if
    present (printing `resumed from step N`), `fit` with the callbacks
    (checkpoints, TerminateOnNaN, CSVLogger, TensorBoard, the monitor that puts
    the learning rate and tokens/s into the progress bar), then the final model:
    averaged over the last `average_last` checkpoints if > 1 (§6.1), saved as
    `model.keras` (float32), and `curves.png`.

    Args:
        args: a `TrainingArgs`.
        callbacks: extra Keras callbacks for `fit`.
        strategy: a `tf.distribute.Strategy` (default `get_strategy()`).

    Returns:
        a `TrainingResult`.
    """
    from keras_transformer import distribute

    if strategy is None:
        strategy = distribute.get_strategy()

    import keras
    import tensorflow as tf

    from keras_transformer import data
    from keras_transformer.losses import MaskedAccuracy
    from keras_transformer.model import Transformer
    from keras_transformer.optimization import create_optimizer
    from keras_transformer.tokenizer import get_or_train_tokenizer

    _check_time_budget(args, strategy)
    RunMonitor = _make_monitor_class()
    run = _Run(args, strategy)
    num_replicas = args.batch_multiple or strategy.num_replicas_in_sync
    model_config = args.model_config()
    saved = _check_resume_config(run.run_dir, args, model_config)
    max_length = model_config.max_length

    precision, precision_reason = args.precision, None
    if precision == "auto":
        precision, precision_reason = distribute.auto_precision()
    previous_policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(precision)
    try:
        backup = run.find_backup()
        start_step = backup[0] if backup else 0
        run.trained_seconds = backup[2] if backup else 0.0
        # Dropout's random state is not part of the backup: a resumed run draws
        # new masks (seeded by the step) rather than replaying those of step 0.
        keras.utils.set_random_seed(args.seed + start_step)
        tokenizer = get_or_train_tokenizer(run.run_dir, _training_texts(args), args.vocab_size)
        train_text = data.load_dataset(args.data, "train", args.src, args.tgt)
        training_data = _TrainingData(args, tokenizer, train_text, num_replicas, max_length)
        steps_per_epoch = None
        if saved is not None:  # a resumed run keeps its epoch length (counting costs a pass over the data)
            saved_data = saved.get("data", {})
            if saved_data.get("batch_multiple") == num_replicas and not (
                training_data.streamed and args.steps_per_epoch
                and args.steps_per_epoch != saved_data.get("steps_per_epoch")
            ):
                steps_per_epoch = saved_data.get("steps_per_epoch")
            elif saved_data.get("batch_multiple") != num_replicas:
                print(f"Batch sizes are now multiples of {num_replicas} (were {saved_data.get('batch_multiple')}): "
                      "the batches after the resume differ from those of the original run.", flush=True)
        if not steps_per_epoch:
            steps_per_epoch = training_data.batches_per_epoch()
        if steps_per_epoch < 1:
            raise ValueError("No training batch: the data is smaller than one batch of --batch-tokens.")
        run.steps_per_epoch = steps_per_epoch
        if args.max_steps:
            total_steps = args.max_steps
        else:
            total_steps = (args.epochs or 10) * steps_per_epoch
        if run.is_chief:
            _atomic_write_text(os.path.join(run.run_dir, CONFIG_FILENAME), json.dumps({
                "model": model_config.to_dict(),
                "training": args.to_dict(),
                "data": {"spec": args.data, "src": args.src, "tgt": args.tgt,
                         "steps_per_epoch": steps_per_epoch, "total_steps": total_steps,
                         "num_replicas": strategy.num_replicas_in_sync, "batch_multiple": num_replicas,
                         "streamed": training_data.streamed},
                "precision": precision,
                "tokenizer": "spm.model",
                "final_model": MODEL_FILENAME,
            }, indent=2, sort_keys=True))

        validation = None
        if args.validation_split:
            validation = training_data.validation(
                data.load_dataset(args.data, _validation_split(args), args.src, args.tgt))

        with strategy.scope():
            model = Transformer(model_config)
            model.compile(
                optimizer=create_optimizer(model_config.d_model, args.warmup_steps, args.lr_scale),
                metrics=[MaskedAccuracy()] + _make_count_metrics(),
                jit_compile=bool(args.xla),
                steps_per_execution=args.steps_per_execution,
            )
            model.build()
            model.optimizer.build(model.trainable_variables)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            _work_around_keras_multiworker(model, strategy, training_data.stream(0, steps_per_epoch).element_spec)

        if backup is not None:
            weights = backup[1]
            with strategy.scope():
                model.load_weights(weights)
            print(f"resumed from step {start_step}", flush=True)
            logger.info("Resumed %s from step %d (%s)", run.run_dir, start_step, weights)
        budget_spent = run.out_of_time()  # before training: the earlier processes' time alone
        to_train = start_step < total_steps and not budget_spent
        if to_train:
            # Rows of the epoch about to be redone are rewritten; checkpoints past the
            # resume point (written after the last backup) are stale.
            run.truncate_logs(start_step)
            for step, path in list_checkpoints(run.out_dir):
                if step > start_step:
                    os.remove(path)

        n_params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
        shown = f"{precision}: --precision auto, {precision_reason}" if precision_reason else precision
        budget = f" or {args.time_budget:g} min of training" if args.time_budget is not None else ""
        print(
            f"Training {args.preset} model ({n_params:,} parameters, {shown}) on {args.data} "
            f"{args.src}->{args.tgt}: {strategy.num_replicas_in_sync} replica(s), {steps_per_epoch} steps/epoch, "
            f"steps {start_step}->{total_steps}{budget}, run directory {run.run_dir}",
            flush=True,
        )

        monitor = RunMonitor(run, start_step, total_steps)
        all_callbacks = [monitor, keras.callbacks.TerminateOnNaN()]
        all_callbacks.append(_csv_logger(run.path(HISTORY_FILENAME), validation is not None))
        if _tensorboard_available():
            all_callbacks.append(_tensorboard(run.path(LOG_DIR), args.log_every, monitor))
        else:
            print("TensorBoard is not installed (pip install tensorboard): no logs/ for this run.", flush=True)
        all_callbacks.extend(callbacks)
        all_callbacks.append(monitor.epoch_end_backup())

        step = start_step
        if to_train:
            for initial_epoch, epochs, per_epoch in _fit_plan(step, total_steps, steps_per_epoch):
                with warnings.catch_warnings():
                    # Validation sets have an unknown length: Keras warns when they end.
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                    model.fit(training_data.stream(step, steps_per_epoch), initial_epoch=initial_epoch,
                              epochs=epochs, steps_per_epoch=per_epoch, shuffle=False,
                              validation_data=validation, validation_freq=args.validate_every,
                              callbacks=all_callbacks, verbose=args.verbose)
                step = monitor.step
                if monitor.stopped_on_nan or monitor.out_of_time or step >= total_steps:
                    break
            if monitor.out_of_time and step < total_steps:
                print(f"Time budget of {args.time_budget:g} min reached at step {step} "
                      f"({run.training_seconds() / 60:.1f} min of training).", flush=True)
        elif budget_spent:
            print(f"Run already used its time budget of {args.time_budget:g} min (step {start_step}); "
                  "nothing to train.", flush=True)
        else:
            print(f"Run already trained to step {start_step} (>= {total_steps}); nothing to train.", flush=True)

        if monitor.stopped_on_nan:
            print(f"Training stopped at step {step}: the loss is NaN (TerminateOnNaN). "
                  "Try a lower --lr-scale or float32.", flush=True)

        # Final model: float32, compiled with the paper's defaults, averaged if asked (§6.1).
        keras.mixed_precision.set_global_policy("float32")
        final = Transformer(model_config, dtype="float32")
        final.build()
        checkpoints = [p for s, p in list_checkpoints(run.out_dir) if s <= step]
        if args.average_last > 1 and len(checkpoints) > 1 and not monitor.stopped_on_nan:
            chosen = checkpoints[-args.average_last:]
            final.set_weights(average_checkpoints(chosen, final))
            print(f"Averaged the last {len(chosen)} checkpoints: "
                  + ", ".join(os.path.basename(p) for p in chosen), flush=True)
        else:
            final.set_weights(model.get_weights())
        final.compile()
        val_metrics = None
        if validation is not None and not monitor.stopped_on_nan:
            averaged = args.average_last > 1 and len(checkpoints) > 1
            if not averaged and monitor.last_validation and monitor.last_validation[0] == step:
                val_metrics = monitor.last_validation[1]  # the final weights were just validated
            else:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message="Your input ran out of data")
                    logs = final.evaluate(validation, verbose=0, return_dict=True)
                val_metrics = {k: float(logs[k]) for k in ("loss", "accuracy") if k in logs}
            print("Final model on the validation set: "
                  + ", ".join(f"{k} {v:.4f}" for k, v in val_metrics.items()), flush=True)
        if not monitor.stopped_on_nan:
            tmp = run.path(f"tmp-{os.getpid()}-{MODEL_FILENAME}")
            final.save(tmp)
            os.replace(tmp, run.path(MODEL_FILENAME))
        curves = plot_curves(run.out_dir)
        if run.is_chief:
            print(f"Run directory {run.run_dir}: {MODEL_FILENAME}, {CHECKPOINT_DIR}/, {HISTORY_FILENAME}, "
                  f"{LOG_DIR}/" + (f", {CURVES_FILENAME}" if curves else ""), flush=True)
        speed = monitor.timed_tokens / monitor.timed_seconds if monitor.timed_seconds > 0 else None
        return TrainingResult(
            run_dir=run.run_dir, model=final, tokenizer=tokenizer, step=step, resumed_from=start_step,
            history=_read_csv(run.path(HISTORY_FILENAME)), val_metrics=val_metrics, tokens_per_sec=speed,
            stopped_on_nan=monitor.stopped_on_nan,
        )
    finally:
        keras.mixed_precision.set_global_policy(previous_policy)


# ----------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------


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


_CONFIG_FLAGS = (
    # flag, TransformerConfig field, type, help
    ("--num-layers", "num_layers", int, "N, layers per stack (§3.1)"),
    ("--d-model", "d_model", int, "d_model (§3.1)"),
    ("--num-heads", "num_heads", int, "h, attention heads (§3.2.2)"),
    ("--d-ff", "d_ff", int, "d_ff, feed-forward inner width (§3.3)"),
    ("--key-dim", "key_dim", int, "d_k (default d_model / h)"),
    ("--value-dim", "value_dim", int, "d_v (default d_k)"),
    ("--dropout", "dropout", float, "P_drop, residual dropout (§5.4)"),
    ("--attention-dropout", "attention_dropout", float, "dropout on attention weights (0 in the paper)"),
    ("--label-smoothing", "label_smoothing", float, "epsilon_ls (§5.4; 0.1)"),
    ("--positional-encoding", "positional_encoding", str, "sinusoidal (§3.5) or learned"),
)


def add_training_arguments(parser, defaults=None):
    """Adds the `train` options to an argparse parser (also used by the examples)."""
    d = TrainingArgs(**(defaults or {}))
    model = parser.add_argument_group("model")
    model.add_argument("--preset", choices=("tiny", "small", "base", "big"), default=d.preset,
                       help=f"model size (TransformerConfig preset; default {d.preset})")
    for flag, field, kind, text in _CONFIG_FLAGS:
        # A caller's defaults may override the preset (the demo: dropout 0).
        default = d.overrides.get(field)
        if default is not None:
            text += f"; default here {default}"
        model.add_argument(flag, dest=f"config_{field}", type=kind, default=default, metavar=field.upper(), help=text)
    model.add_argument("--norm-first", dest="config_norm_first", action=argparse.BooleanOptionalAction,
                       default=None, help="pre-LN instead of the paper's post-LN")
    model.add_argument("--share-embeddings", dest="config_share_embeddings",
                       action=argparse.BooleanOptionalAction, default=None,
                       help="tie source/target embeddings and the softmax weights (§3.4; default on)")
    model.add_argument("--set", dest="config_set", action="append", default=[], metavar="KEY=VALUE",
                       help="any other TransformerConfig field, e.g. --set layer_norm_epsilon=1e-5 (repeatable)")
    model.add_argument("--vocab-size", type=int, default=d.vocab_size,
                       help=f"joint BPE vocabulary size (§5.1; default {d.vocab_size})")
    model.add_argument("--max-length", type=int, default=d.max_length,
                       help="longest sequence in tokens; longer pairs are skipped (default: the config's, 256)")

    data = parser.add_argument_group("data")
    data.add_argument("--data", default=d.data, help="multi30k | tfds:NAME | files:SRC,TGT (default %(default)s)")
    data.add_argument("--src", default=d.src, help="source language (default %(default)s)")
    data.add_argument("--tgt", default=d.tgt, help="target language (default %(default)s)")
    data.add_argument("--batch-tokens", type=int, default=d.batch_tokens,
                      help="global tokens per batch and side, padding included (§5.1: ~25000; default %(default)s)")
    data.add_argument("--validation-split", default=d.validation_split,
                      help="validation split ('none' for no validation; default %(default)s)")

    schedule = parser.add_argument_group("schedule")
    schedule.add_argument("--epochs", type=int, default=d.epochs, help="passes over the training data (default 10)")
    schedule.add_argument("--max-steps", type=int, default=d.max_steps,
                          help="optimizer steps to train (wins over --epochs; §5.2: 100k base, 300k big)")
    schedule.add_argument("--steps-per-epoch", type=int, default=d.steps_per_epoch,
                          help="epoch length for streamed tfds: data (default 1000)")
    schedule.add_argument("--time-budget", type=float, default=d.time_budget, metavar="MINUTES",
                          help="stop once training has taken this long (over resumes too), if before "
                               "--max-steps/--epochs" + (f" (default {d.time_budget:g})" if d.time_budget else ""))
    schedule.add_argument("--warmup-steps", type=int, default=d.warmup_steps,
                          help="warmup of equation (3) (§5.3; default %(default)s)")
    schedule.add_argument("--lr-scale", type=float, default=d.lr_scale,
                          help="multiplier on equation (3) (default %(default)s)")

    run = parser.add_argument_group("run")
    run.add_argument("--output", "-o", default=d.output, help="run directory (default %(default)s)")
    run.add_argument("--precision", choices=PRECISION_CHOICES, default=d.precision,
                     help="Keras dtype policy; auto: mixed_bfloat16 on a CPU with native bfloat16 "
                          "(AVX512_BF16, AMX) or Ampere+ GPUs, mixed_float16 on Volta/Turing, else float32 "
                          "(default %(default)s)")
    run.add_argument("--xla", action=argparse.BooleanOptionalAction, default=d.xla,
                     help="compile the train step with XLA")
    run.add_argument("--seed", type=int, default=d.seed, help="weights, dropout and data order (default %(default)s)")
    run.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                     help="steps between checkpoints / resume points (default %(default)s)")
    run.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints,
                     help="newest checkpoints to keep (at least --average-last; default %(default)s)")
    run.add_argument("--average-last", type=int, default=d.average_last,
                     help="final model = mean of the last K checkpoints (§6.1: 5 base, 20 big; default off)")
    run.add_argument("--validate-every", type=int, default=d.validate_every,
                     help="epochs between validation runs (default %(default)s)")
    run.add_argument("--log-every", type=int, default=d.log_every,
                     help="steps between steps.csv rows and TensorBoard points (default %(default)s)")
    run.add_argument("--steps-per-execution", type=int, default=d.steps_per_execution,
                     help="train steps per tf.function call (default %(default)s)")
    run.add_argument("--batch-multiple", type=int, default=d.batch_multiple,
                     help="round batch sizes to a multiple of this (default: the replica count)")
    run.add_argument("--verbose", type=_parse_verbose, default=d.verbose, help="fit verbosity: auto, 0, 1, 2")
    return parser


def _parse_verbose(text):
    return text if text == "auto" else int(text)


def args_from_namespace(namespace) -> TrainingArgs:
    """`TrainingArgs` from parsed `add_training_arguments` options."""
    ns = vars(namespace)
    overrides = {}
    for item in ns.get("config_set") or []:
        if "=" not in item:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}.")
        key, value = item.split("=", 1)
        overrides[key.strip()] = _parse_value(value)
    for key, value in ns.items():
        if key.startswith("config_") and key != "config_set" and value is not None:
            overrides[key[len("config_"):]] = value
    validation_split = ns.get("validation_split")
    if isinstance(validation_split, str) and validation_split.lower() in ("none", ""):
        validation_split = None
    known = {f.name for f in dataclasses.fields(TrainingArgs)}
    values = {k: v for k, v in ns.items() if k in known}
    values.update(overrides=overrides, validation_split=validation_split)
    return TrainingArgs(**values)


def _run_train(namespace):
    args = args_from_namespace(namespace)
    result = train(args)
    return 1 if result.stopped_on_nan else 0


def _run_average(namespace):
    output, chosen = write_averaged_model(namespace.run_dir, namespace.last, namespace.output)
    print(f"Averaged {len(chosen)} checkpoints of {namespace.run_dir} into {output}:")
    for path in chosen:
        print(f"  {os.path.basename(path)}")
    return 0


def register_commands(subparsers):
    """Adds `train` and `average-checkpoints` to the `keras-transformer` command."""
    train_parser = subparsers.add_parser(
        "train",
        help="train (or continue) a run with model.fit under tf.distribute",
        description=(
            "Trains a Transformer (Vaswani et al., 2017) with the paper's optimizer, schedule and "
            "regularization (§5.3, §5.4) into a run directory. Run the same command again to continue "
            "an interrupted run from its last checkpoint."
        ),
    )
    add_training_arguments(train_parser)
    train_parser.set_defaults(func=_run_train)

    average = subparsers.add_parser(
        "average-checkpoints",
        help="average the last K checkpoints of a run into one model (§6.1)",
        description="Writes the element-wise mean of the weights of the last K checkpoints of RUN_DIR.",
    )
    average.add_argument("run_dir", metavar="RUN_DIR")
    average.add_argument("--last", type=int, default=5, help="K: checkpoints to average (default 5; §6.1)")
    average.add_argument("--output", help="output .keras or .weights.h5 (default RUN_DIR/model-avg{K}.keras)")
    average.set_defaults(func=_run_average)
