"""The Keras callbacks of a training run: progress, checkpoints, the time budget and the logs."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import threading
import time

import keras
import numpy as np
from keras import ops

from keras_transformer import compat
from keras_transformer.run_dir import HISTORY_FILENAME, LOG_DIR
from keras_transformer.special_ids import PAD_ID


class TargetTokens(keras.metrics.Sum):
    """Target tokens (labels other than padding) seen, summed over replicas: the `tokens` of tokens/s."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(ops.sum(ops.cast(ops.not_equal(y_true, PAD_ID), "float32")))


class Sequences(keras.metrics.Sum):
    """Batch rows seen (sentence pairs, and any empty rows that fill a batch), summed over replicas: the weights of
    Keras' running loss mean."""

    def update_state(self, y_true, y_pred, sample_weight=None):
        return super().update_state(ops.cast(ops.shape(y_true)[0], "float32"))


def count_metrics():
    """The `tokens` and `sequences` metrics the monitor reads (they never reach the logs)."""
    return [TargetTokens(name="tokens"), Sequences(name="sequences")]


def current_learning_rate(optimizer, iterations=None):
    """Learning rate of the update just applied (step `iterations - 1`)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = compat.learning_rate_schedule(inner)
    if iterations is None:
        iterations = int(inner.iterations.numpy())
    if callable(schedule) and not hasattr(schedule, "numpy"):
        return float(np.asarray(schedule(max(iterations - 1, 0))))
    return float(np.asarray(inner.learning_rate))


def cooldown_factor(step, total_steps, fraction, seconds=0.0, budget_seconds=None):
    """The learning-rate factor of the update after `step` updates: 1 until the last `fraction` of the run,
    then falling linearly to 0 at its end (`optimization.Cooldown`).

    The run's progress is `step / total_steps`, or its training time over the
    time budget if that is further along (the budget will end it first).
    """
    progress = step / total_steps
    if budget_seconds:
        progress = max(progress, seconds / budget_seconds)
    return min(1.0, max(0.0, (1.0 - progress) / fraction))


class LinearCooldown(keras.callbacks.Callback):
    """Sets the `optimization.Cooldown` factor of the model's optimizer before every step (`cooldown_factor`).

    Stateless: a resumed run computes the same factor from its step and the
    training time its backup recorded.
    """

    def __init__(self, run, monitor, total_steps, fraction):
        super().__init__()
        self.run, self.monitor, self.total_steps, self.fraction = run, monitor, total_steps, fraction

    def on_train_batch_begin(self, batch, logs=None):
        budget = self.run.args.time_budget
        factor = cooldown_factor(
            self.monitor.step,
            self.total_steps,
            self.fraction,
            self.run.training_seconds(),
            60.0 * budget if budget is not None else None,
        )
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        compat.learning_rate_schedule(optimizer).factor.assign(factor)


# A test hook: "STEP" or "STEP:SIGNAL" (e.g. "5:SIGTERM", default SIGTERM) makes the run send that
# signal to its own process at the end of step STEP, to test the stop on a signal at a known step.
SIGNAL_AT_STEP_ENVIRONMENT = "KERAS_TRANSFORMER_TEST_SIGNAL_AT_STEP"


class TrainingInterrupted(KeyboardInterrupt):
    """Training stopped on SIGINT or SIGTERM, after writing a checkpoint and the backup at its last step.

    A `KeyboardInterrupt`, as Ctrl-C would raise, so that callers stop as
    they do on Ctrl-C; `signal` is the signal's number, `step` the step saved.
    """

    def __init__(self, signum, step):
        super().__init__(f"{signal.Signals(signum).name} at step {step}")
        self.signal = signum
        self.step = step


class StopOnSignal:
    """Context manager: SIGINT and SIGTERM end training at the end of the current step.

    While active (in the main thread only: Python runs signal handlers
    there), the first SIGINT or SIGTERM is only recorded in `received`;
    `RunMonitor` sees it at the end of the step being computed, writes a
    checkpoint and stops. A second signal is not deferred: SIGINT raises
    `KeyboardInterrupt`, SIGTERM gets the handler that was there before
    (by default, the end of the process).
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum, frame):
        if self.received is None:
            self.received = signum
            return
        self.__exit__()
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)


def signal_at_step_from_environment():
    """`(step, signal number)` of the `SIGNAL_AT_STEP_ENVIRONMENT` test hook, or None.

    Example:
        >>> os.environ[SIGNAL_AT_STEP_ENVIRONMENT] = "5:SIGINT"
        >>> signal_at_step_from_environment() == (5, signal.SIGINT)
        True
        >>> del os.environ[SIGNAL_AT_STEP_ENVIRONMENT]
    """
    value = os.environ.get(SIGNAL_AT_STEP_ENVIRONMENT, "").strip()
    if not value:
        return None
    step, _, name = value.partition(":")
    return int(step), signal.Signals[name or "SIGTERM"]


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
    - Every `checkpoint_every` steps, and once `checkpoint_minutes` have
      passed since the last checkpoint (`Run.clock`), writes a checkpoint
      and the backup (and `EpochEndBackup` the backup at each epoch end).
    - Stops training at `total_steps`, or once the run's training time
      reaches `--time-budget`, with a checkpoint at that step.
    - With `signals` (a `StopOnSignal`), stops at the end of the step
      during which SIGINT or SIGTERM came, with a checkpoint at that step
      (`interrupted`), so that the run resumes from there.
    - With a `validator` (`training.validation_bleu.ValidationBleu`),
      translates the validation set when it is due, puts the latest BLEU
      into the epoch logs as `val_bleu`, and stops (with a checkpoint) when
      its early stopping says so.
    """

    def __init__(self, run, start_step, total_steps, validator=None, signals=None, signal_at_step=None):
        super().__init__()
        self.run = run
        self.signals = signals
        self.signal_at_step = signal_at_step  # the test hook's (step, signal), or None
        self.interrupted = None  # the signal training stopped on
        self._last_checkpoint_time = None  # `Run.clock` at the last checkpoint (or the start)
        self.validator = validator
        self.early_stopped = False
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
            self.run.train_start = self.run.clock()
        if self._last_checkpoint_time is None:
            self._last_checkpoint_time = self.run.clock()

    def _checkpoint_due_by_time(self):
        minutes = self.run.args.checkpoint_minutes
        return minutes is not None and self.run.clock() - self._last_checkpoint_time >= 60.0 * minutes

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start_step = self.step
        self._first = None  # (time, tokens) at the end of the epoch's first call
        self._last = None
        self._speed_ref = None
        self._window = (0.0, 0.0, 0.0, 0.0)  # sequences, loss sum, tokens, correct

    def on_train_batch_end(self, batch, logs=None):
        logs = logs if logs is not None else {}
        now = time.perf_counter()
        # `batch` is the last step of the execution (`steps_per_execution` > 1); the
        # last execution of an epoch may stop short at the epoch's end.
        steps_in_epoch = (self.params or {}).get("steps")
        done_in_epoch = batch + 1 if not steps_in_epoch else min(batch + 1, steps_in_epoch)
        previous, self.step = self.step, self._epoch_start_step + done_in_epoch
        if self.model.distribute_strategy.num_replicas_in_sync > 1:
            # Keras logs the mean (or first) of the replicas' own metric values;
            # read the metrics across replicas instead: exact global values.
            logs.update({k: float(np.asarray(v).reshape(-1)[0]) for k, v in self.model.get_metrics_result().items()})
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
        lr = current_learning_rate(self.model.optimizer)
        logs["learning_rate"] = lr
        if self._speed is not None:
            logs["tokens_per_sec"] = self._speed
        args = self.run.args
        self.out_of_time = self.out_of_time or self.run.out_of_time()
        last = self.step >= self.total_steps or self.out_of_time
        if self.validator is not None and not self.stopped_on_nan and self.validator.due(previous, self.step, last):
            started = time.perf_counter()
            self.early_stopped = self._validate()
            last = last or self.early_stopped
            self._exclude_from_speed(time.perf_counter() - started)
        if self.run.is_chief and (self._crossed(previous, args.log_every) or last):
            self._log_step(loss, float(logs.get("accuracy", float("nan"))), sequences, tokens, lr)
        if self.signal_at_step is not None and previous < self.signal_at_step[0] <= self.step:
            os.kill(os.getpid(), self.signal_at_step[1])
        if self.signals is not None and self.signals.received is not None and not last:
            self.interrupted = self.signals.received
            last = True
        due = self._crossed(previous, args.checkpoint_every) or self._checkpoint_due_by_time()
        if not self.stopped_on_nan and (due or last):
            self.run.save_checkpoint(self.model, self.step)
            self.last_backup = self.step
            self._last_checkpoint_time = self.run.clock()
        if last:
            self.model.stop_training = True

    def _validate(self):
        """The validator on the weights validation uses: the moving average with `--ema`."""
        optimizer = getattr(self.model.optimizer, "inner_optimizer", self.model.optimizer)
        ema = getattr(optimizer, "use_ema", False)
        if ema:
            compat.swap_ema_weights(self.model)
        try:
            return self.validator(self.model, self.step)
        finally:
            if ema:
                compat.swap_ema_weights(self.model)

    def _exclude_from_speed(self, seconds):
        """Time spent on something else than training steps does not count into tokens/s."""
        self._last = (self._last[0] + seconds, self._last[1])
        self._speed_ref = (self._speed_ref[0] + seconds, self._speed_ref[1])
        self._first = (self._first[0] + seconds, self._first[1])

    def _crossed(self, previous, every):
        return self.step // every > previous // every

    def _log_step(self, loss, accuracy, sequences, tokens, lr):
        seqs0, loss_sum0, tokens0, correct0 = self._window
        loss_sum, correct = loss * sequences, accuracy * tokens
        window_loss = (loss_sum - loss_sum0) / (sequences - seqs0) if sequences > seqs0 else loss
        window_acc = (correct - correct0) / (tokens - tokens0) if tokens > tokens0 else accuracy
        self._window = (sequences, loss_sum, tokens, correct)
        self.run.append_step_row(
            dict(
                step=self.step,
                epoch=self.run.epoch_of(self.step),
                loss=round(window_loss, 6),
                accuracy=round(window_acc, 6),
                learning_rate=lr,
                tokens_per_sec=round(self._speed, 1) if self._speed is not None else "",
                elapsed_sec=round(time.perf_counter() - self.run.start_time, 2),
            )
        )

    def on_epoch_end(self, epoch, logs=None):
        logs = logs if logs is not None else {}
        logs["step"] = self.step
        logs["learning_rate"] = current_learning_rate(self.model.optimizer)
        if self._first is not None and self._last[0] > self._first[0]:
            logs["tokens_per_sec"] = (self._last[1] - self._first[1]) / (self._last[0] - self._first[0])
        logs["elapsed"] = time.perf_counter() - self.run.start_time
        for key in ("val_tokens", "val_sequences", "val_rdrop_kl"):
            logs.pop(key, None)
        if "val_loss" in logs:
            self.last_validation = (
                self.step,
                {k: float(logs[f"val_{k}"]) for k in ("loss", "accuracy") if f"val_{k}" in logs},
            )
        if self.validator is not None and self.validator.latest is not None:
            logs["val_bleu"] = self.validator.latest[1]

    def on_test_batch_end(self, batch, logs=None):
        if logs is not None:
            logs.pop("tokens", None)
            logs.pop("sequences", None)


class EpochEndBackup(keras.callbacks.Callback):
    """A resume point at every epoch end; goes last in the callback list.

    Written after the epoch's history.csv row: a resumed run redoes the rows
    of epochs that are not complete.
    """

    def __init__(self, monitor):
        super().__init__()
        self.monitor = monitor

    def on_epoch_end(self, epoch, logs=None):
        monitor = self.monitor
        if not monitor.stopped_on_nan and monitor.step != monitor.last_backup:
            monitor.run.save_backup(self.model, monitor.step)
            monitor.last_backup = monitor.step


class ValidateWithEMA(keras.callbacks.Callback):
    """Evaluates (Keras' validation at epoch ends) with the moving average of the weights.

    Swaps the weights and their averages exactly before and after each
    evaluation (`compat.swap_ema_weights`), so training goes on with its own
    weights, bit for bit.
    """

    def on_test_begin(self, logs=None):
        compat.swap_ema_weights(self.model)

    def on_test_end(self, logs=None):
        compat.swap_ema_weights(self.model)


class KeepTrainingWeights(keras.callbacks.Callback):
    """Keeps a copy of the training weights at each epoch end, so that they can be put back.

    With an exponential moving average (`use_ema`), every `fit()` call ends by
    overwriting the model's weights with the average. A run made of several
    `fit()` calls (a resume inside an epoch, `--steps-per-execution`) must go
    on training its own weights: `restore()` puts the copy back.
    """

    def __init__(self):
        super().__init__()
        self.weights = None

    def on_epoch_end(self, epoch, logs=None):
        self.weights = [v.numpy() for v in self.model.trainable_variables]

    def restore(self):
        """Puts the training weights of the last epoch end back into the model."""
        for variable, value in zip(self.model.trainable_variables, self.weights):
            variable.assign(value)


def fit_callbacks(run, monitor, with_validation, with_bleu, extra=()):
    """The callbacks of the run's `fit` calls, in order, and the `KeepTrainingWeights` of `--ema`.

    The monitor first (it sets the step the others read), the extra callbacks
    before the last one, `EpochEndBackup`, which writes the resume point after
    the epoch's `history.csv` row.
    """
    args = run.args
    callbacks = [monitor]
    if args.cooldown:
        callbacks.append(LinearCooldown(run, monitor, monitor.total_steps, args.cooldown))
    callbacks += [
        keras.callbacks.TerminateOnNaN(),
        FixedColumnsCSVLogger(run.path(HISTORY_FILENAME), with_validation, with_bleu=with_bleu),
    ]
    if tensorboard_available():
        callbacks.append(GlobalStepTensorBoard(run.path(LOG_DIR), args.log_every, monitor))
    else:
        print("TensorBoard is not installed (pip install tensorboard): no logs/ for this run.", flush=True)
    keeper = KeepTrainingWeights()
    if args.ema:
        # Validation with the averaged weights; each fit() ends by writing them into the
        # model, so the training weights are put back before the next call (not after the last).
        callbacks += [ValidateWithEMA(), keeper]
    return callbacks + list(extra) + [EpochEndBackup(monitor)], keeper


def tensorboard_available():
    return importlib.util.find_spec("tensorboard") is not None


class GlobalStepTensorBoard(keras.callbacks.TensorBoard):
    """`keras.callbacks.TensorBoard` whose batch-level step axis is the global step,
    also after a resume (Keras restarts it at 0 in every `fit`) and with
    `steps_per_execution` > 1 (Keras counts one per execution)."""

    def __init__(self, log_dir, update_freq, monitor):
        super().__init__(log_dir, update_freq=update_freq, write_graph=False)
        self.monitor = monitor

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        compat.set_tensorboard_batch_count(self, self.monitor.step)

    def on_train_batch_begin(self, batch, logs=None):
        # The step this execution ends at (Keras' own count adds 1 to it below).
        per_execution = getattr(self.model, "steps_per_execution", 1) or 1
        steps_in_epoch = (self.params or {}).get("steps")
        end = batch + per_execution if not steps_in_epoch else min(batch + per_execution, steps_in_epoch)
        compat.set_tensorboard_batch_count(self, self.monitor._epoch_start_step + end - 1)
        super().on_train_batch_begin(batch, logs)


class FixedColumnsCSVLogger(keras.callbacks.CSVLogger):
    """`keras.callbacks.CSVLogger` (appending, for resumed runs) with fixed columns:
    the training logs, then `val_accuracy` and `val_loss` when there is validation,
    then `val_bleu` with `--validate-bleu-every`."""

    def __init__(self, path, with_validation, with_bleu=False):
        super().__init__(path, append=True)
        self.with_validation = with_validation
        self.with_bleu = with_bleu

    def on_epoch_end(self, epoch, logs=None):
        if self.keys is None and logs:
            train_keys = sorted(k for k in logs if not k.startswith("val_"))
            self.keys = train_keys + (["val_accuracy", "val_loss"] if self.with_validation else [])
            if "val_bleu" in logs or self.with_bleu:
                self.keys.append("val_bleu")
        super().on_epoch_end(epoch, logs)
