"""The state of one training process: its directories, checkpoints, resume point and logs."""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import time

from keras_transformer.errors import ParameterError
from keras_transformer.run_dir import (
    BACKUP_DIR,
    BLEU_FILENAME,
    CHECKPOINT_DIR,
    CONFIG_FILENAME,
    HISTORY_FILENAME,
    STEPS_FILENAME,
    atomic_write_text,
    checkpoint_path,
    list_checkpoints,
    read_config,
    save_model_weights,
)
from keras_transformer.training.options import RESUME_FIXED, RESUME_LEGACY_VALUES
from keras_transformer.training.strategy import strategy_worker


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run goes on after an interruption: its `backup/state.json`.

    Attributes:
        step: the training steps done when the backup was written.
        weights: path of the backup's full state (model and optimizer weights).
        training_seconds: training time of the run's processes up to the backup.
        iterations: the optimizer's updates at the backup, to check that a
            resume loaded its state (`check_optimizer_loaded`); None in a
            backup that did not record them.

    Example:
        >>> point = ResumePoint(step=30, weights="backup/state-00000030.weights.h5", training_seconds=12.5)
        >>> point.step, point.iterations
        (30, None)
    """

    step: int
    weights: str
    training_seconds: float = 0.0
    iterations: int | None = None

    @classmethod
    def read(cls, backup_dir):
        """The resume point recorded in `backup_dir`, or None if it has none (or its weights are gone)."""
        state_path = os.path.join(backup_dir, "state.json")
        if not os.path.exists(state_path):
            return None
        with open(state_path, encoding="utf-8") as f:
            state = json.load(f)
        weights = os.path.join(backup_dir, state["weights"])
        if not os.path.exists(weights):
            return None
        return cls(
            step=int(state["step"]),
            weights=weights,
            training_seconds=float(state.get("training_seconds", 0.0)),
            iterations=state.get("iterations"),
        )


class Run:
    """State of one training process: directories, chief or not, data stream, checkpoints."""

    # The clock of the time budget (seconds); tests replace it to pace training without sleeping.
    clock = staticmethod(time.perf_counter)

    def __init__(self, args, strategy):
        self.args = args
        self.strategy = strategy
        self.is_chief, self.worker_index = strategy_worker(strategy)
        self.run_dir = os.path.abspath(args.output)
        # Non-chief workers write into their own subdirectory (same layout).
        self.out_dir = self.run_dir if self.is_chief else os.path.join(self.run_dir, f"worker-{self.worker_index}")
        self.start_time = self.clock()
        self.steps_per_epoch = None
        self.trained_seconds = 0.0  # training time of the run's earlier processes (from the backup)
        self.train_start = None  # when this process began training
        os.makedirs(self.out_dir, exist_ok=True)
        os.makedirs(os.path.join(self.out_dir, CHECKPOINT_DIR), exist_ok=True)

    def training_seconds(self):
        """Training time of the run so far: earlier processes up to the backup, plus this one's."""
        if self.train_start is None:
            return self.trained_seconds
        return self.trained_seconds + self.clock() - self.train_start

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
        save_model_weights(model, checkpoint_path(self.path(CHECKPOINT_DIR), step))
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
        # The optimizer's updates, to check that a resume loaded its state (`check_optimizer_loaded`).
        iterations = int(model.optimizer.iterations.numpy())
        atomic_write_text(
            os.path.join(backup, "state.json"),
            json.dumps(
                {
                    "step": step,
                    "weights": name,
                    "training_seconds": round(self.training_seconds(), 3),
                    "iterations": iterations,
                },
                indent=2,
            ),
        )
        for old in glob.glob(os.path.join(backup, "state-*.weights.h5")) + glob.glob(os.path.join(backup, "tmp-*")):
            if os.path.basename(old) != name:
                try:
                    os.remove(old)
                except FileNotFoundError:
                    pass

    def find_backup(self):
        """The `ResumePoint` of the run's backup, or None on a fresh run.

        Workers prefer the chief's.
        """
        candidates = [os.path.join(self.run_dir, BACKUP_DIR)]
        if not self.is_chief:
            candidates.append(self.path(BACKUP_DIR))
        for backup in candidates:
            point = ResumePoint.read(backup)
            if point is not None:
                return point
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
        _filter_csv(self.path(BLEU_FILENAME), lambda row: int(row["step"]) <= step)


def check_optimizer_loaded(model, iterations, source, remedy):
    """Raises unless `model.load_weights(source)` loaded the optimizer state of `iterations` updates.

    Keras skips a saved optimizer whose variables differ from the model's
    (with and without `ema`) with a warning only: Adam's moments and the
    step of the learning-rate schedule would silently start over. `iterations`
    None (a backup that does not record them): any but 0 will do.
    """
    loaded = int(model.optimizer.iterations.numpy())
    if loaded == iterations or (iterations is None and loaded > 0):
        return
    raise ValueError(
        f"The optimizer state in {source} was not loaded: the optimizer is at {loaded} updates, not "
        f"{iterations if iterations is not None else 'those saved'}. Keras skips the state of an optimizer with "
        f"other variables (another ema): {remedy}."
    )


def check_resume_config(run_dir, args, model_config):
    """The first run's `config.json`, or None for a new run; refuses a resume that changes the experiment.

    A resume may change how a run is carried out (checkpoints, logs, the
    time budget) but not what it trains: the model configuration and the
    options of `options.RESUME_FIXED` (data, batches, schedule, precision)
    must be those the run was started with.

    Args:
        run_dir: the run directory (`TrainingArgs.output`).
        args: the `TrainingArgs` of this process.
        model_config: the `TransformerConfig` it would train.

    Returns:
        the first run's `config.json` as a dict, or None if `run_dir` holds no run.

    Raises:
        ParameterError: (`output`) naming each changed field with the run's value and the one given.
    """
    if not os.path.exists(os.path.join(run_dir, CONFIG_FILENAME)):
        return None
    saved = read_config(run_dir)
    problems = []
    saved_model, model = saved.get("model", {}), model_config.to_dict()
    for key in sorted(set(saved_model) | set(model)):
        if saved_model.get(key) != model.get(key):
            problems.append(f"model {key} ({saved_model.get(key)!r} -> {model.get(key)!r})")
    # A run recorded before an option existed had its legacy value.
    saved_training = {**RESUME_LEGACY_VALUES, **saved.get("training", {})}
    for key in RESUME_FIXED:
        if key in saved_training and saved_training[key] != getattr(args, key):
            problems.append(f"{key} ({saved_training[key]!r} -> {getattr(args, key)!r})")
    if problems:
        raise ParameterError(
            "output",
            f"{run_dir} holds a run with a different {'; '.join(problems)}. Use the same options to "
            "continue it, or another output directory.",
        )
    return saved


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
