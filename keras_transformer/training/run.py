"""The state of one training process: its directories, checkpoints, resume point and logs."""

from __future__ import annotations

import csv
import dataclasses
import glob
import json
import os
import shutil
import time

from keras_transformer import compat
from keras_transformer.errors import ParameterError
from keras_transformer.run_dir import (
    BACKUP_DIR,
    BACKUP_STATE_FILENAME,
    BLEU_FILENAME,
    CHECKPOINT_DIR,
    CONFIG_FILENAME,
    HISTORY_FILENAME,
    STEPS_FILENAME,
    TOKENIZER_DATA_FILENAME,
    TOKENIZER_FILENAME,
    atomic_write_text,
    checkpoint_path,
    file_sha256,
    is_temporary_name,
    list_checkpoints,
    read_config,
    save_model_weights,
    temporary_path,
    weights_file_problem,
)
from keras_transformer.training import disk
from keras_transformer.training.lock import LOCK_FILENAME, RunLock
from keras_transformer.training.options import RESUME_FIXED, RESUME_LEGACY_VALUES
from keras_transformer.training.strategy import strategy_worker

# What a run's start writes into a new run directory, before training (`remove_unstarted_directory`).
_WRITTEN_AT_START = (LOCK_FILENAME, TOKENIZER_FILENAME, "spm.vocab", TOKENIZER_DATA_FILENAME, CONFIG_FILENAME)


class ResumeError(ValueError):
    """A run that cannot go on as its directory stands: the message names the file and the way out."""


@dataclasses.dataclass(frozen=True)
class ResumePoint:
    """Where a run goes on after an interruption: its `backup/state.json`, or a checkpoint.

    Attributes:
        step: the training steps done when the backup was written.
        weights: path of the backup's full state (model and optimizer weights).
        training_seconds: training time of the run's processes up to the backup.
        iterations: the optimizer's updates at the backup, to check that a
            resume loaded its state (`check_optimizer_loaded`); None in a
            backup that did not record them.
        sha256: the checksum of `weights` recorded when it was written (None
            in a backup that did not record it): checked before the file is
            trusted (`problem`).
        optimizer_state: False for a checkpoint (model weights only), which a
            run falls back on when its backup is missing or corrupt: Adam's
            moments start again, the learning-rate schedule goes on from `step`.

    Example:
        >>> point = ResumePoint(step=30, weights="backup/state-00000030.weights.h5", training_seconds=12.5)
        >>> point.step, point.iterations, point.optimizer_state
        (30, None, True)
    """

    step: int
    weights: str
    training_seconds: float = 0.0
    iterations: int | None = None
    sha256: str | None = None
    optimizer_state: bool = True

    @classmethod
    def read(cls, backup_dir):
        """The resume point recorded in `backup_dir`, or None if it has no `state.json`.

        Raises:
            ResumeError: `state.json` cannot be read or names no step and weights.
        """
        state_path = os.path.join(backup_dir, BACKUP_STATE_FILENAME)
        if not os.path.exists(state_path):
            return None
        try:
            with open(state_path, encoding="utf-8") as f:
                state = json.load(f)
            return cls(
                step=int(state["step"]),
                weights=os.path.join(backup_dir, state["weights"]),
                training_seconds=float(state.get("training_seconds", 0.0)),
                iterations=state.get("iterations"),
                sha256=state.get("sha256"),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            raise ResumeError(f"{state_path} is not a readable backup state ({type(error).__name__})") from None

    def problem(self):
        """Why the weights of this point cannot be trusted (missing, corrupt), or None."""
        return weights_file_problem(self.weights, self.sha256)


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
        # One process per directory, from before anything is written in it until `close()`.
        self.lock = RunLock(self.out_dir).acquire()
        os.makedirs(os.path.join(self.out_dir, CHECKPOINT_DIR), exist_ok=True)
        self.remove_stale_temporaries()

    def remove_unstarted_directory(self):
        """Removes the run directory after a failed start, if it holds nothing but what a start writes.

        For a directory this process created (the caller knows): its lock, an
        empty `checkpoints/`, the vocabulary and its data, `config.json`, and
        temporaries. Anything else (a file a user put there meanwhile, a
        checkpoint) keeps it. The chief's directory only.
        """
        if not self.is_chief or not os.path.isdir(self.out_dir):
            return
        for name in os.listdir(self.out_dir):
            path = os.path.join(self.out_dir, name)
            if name == CHECKPOINT_DIR and os.path.isdir(path) and not os.listdir(path):
                continue
            if name not in _WRITTEN_AT_START and not is_temporary_name(name):
                return
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def close(self):
        """Releases the run directory's lock (the end of the process would too)."""
        self.lock.release()

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
        """Backup (full state) first, then the model-only checkpoint.

        Raises:
            disk.DiskFullError: the disk has no room for them (checked first);
                the run's earlier backup and checkpoints are left whole.
        """
        what = f"the checkpoint of step {step}"
        payload = disk.state_bytes(model) + disk.state_bytes(model, optimizer=False)
        disk.check_free_space(self.path(CHECKPOINT_DIR), payload, what, self.resume_hint())
        self.save_backup(model, step)
        path = checkpoint_path(self.path(CHECKPOINT_DIR), step)
        with disk.stop_when_disk_full(self.path(CHECKPOINT_DIR), [temporary_path(path)], what, self.resume_hint()):
            save_model_weights(model, path)
        keep = max(self.args.keep_checkpoints, self.args.average_last)
        # Only this run's own line of checkpoints up to `step` rotates: any past it are left alone.
        own = [path for saved, path in list_checkpoints(self.out_dir) if saved <= step]
        for old in own[:-keep]:
            try:
                os.remove(old)
            except FileNotFoundError:
                pass

    def save_backup(self, model, step):
        backup = self.path(BACKUP_DIR)
        os.makedirs(backup, exist_ok=True)
        name = f"state-{step:08d}.weights.h5"
        tmp = temporary_path(os.path.join(backup, name))
        state_path = os.path.join(backup, BACKUP_STATE_FILENAME)
        what, hint = f"the backup of step {step}", self.resume_hint()
        disk.check_free_space(backup, disk.state_bytes(model), what, hint)
        with disk.stop_when_disk_full(backup, [tmp, f"{state_path}.tmp-{os.getpid()}"], what, hint):
            model.save_weights(tmp)
            sha256 = file_sha256(tmp)  # what is on disk, checked again before a resume trusts it
            os.replace(tmp, os.path.join(backup, name))
            # The optimizer's updates, to check that a resume loaded its state (`check_optimizer_loaded`).
            iterations = int(model.optimizer.iterations.numpy())
            state = {
                "step": step,
                "weights": name,
                "training_seconds": round(self.training_seconds(), 3),
                "iterations": iterations,
                "sha256": sha256,
            }
            atomic_write_text(state_path, json.dumps(state, indent=2))
        for old in glob.glob(os.path.join(backup, "state-*.weights.h5")) + glob.glob(os.path.join(backup, "tmp-*")):
            if os.path.basename(old) != name:
                try:
                    os.remove(old)
                except FileNotFoundError:
                    pass

    def resume_hint(self):
        """How the run goes on after it stopped now: the step and file it resumes from, for messages."""
        try:
            point = ResumePoint.read(self.path(BACKUP_DIR))
        except ResumeError:
            point = None
        checkpoints = list_checkpoints(self.out_dir)
        if point is not None:
            where = f"step {point.step} ({point.weights})"
        elif checkpoints:
            where = f"step {checkpoints[-1][0]} ({checkpoints[-1][1]}, with a new optimizer state)"
        else:
            return "nothing is saved yet; free space and run the same command again to start the run."
        return f"the run stopped and resumes from {where}; free space and run the same command again."

    def find_resume_point(self):
        """The `ResumePoint` to go on from, or None on a fresh run.

        The backup (workers prefer the chief's) if it is intact (its checksum);
        else the newest intact checkpoint, with a new optimizer state (said on
        stdout). A run never starts again from step 0 over checkpoints it
        cannot trust.

        Raises:
            ResumeError: the backup is missing or corrupt and no checkpoint is
                intact: names the file and the way out.
        """
        candidates = [os.path.join(self.run_dir, BACKUP_DIR)]
        if not self.is_chief:
            candidates.append(self.path(BACKUP_DIR))
        problems = []
        for backup in candidates:
            try:
                point = ResumePoint.read(backup)
            except ResumeError as error:
                problems.append(str(error))
                continue
            if point is not None:
                problem = point.problem()
                if problem is None:
                    return point
                problems.append(problem)
        for step, path in reversed(list_checkpoints(self.out_dir)):
            problem = weights_file_problem(path)
            if problem is None:
                why = problems[0] if problems else f"{self.path(BACKUP_DIR)} is missing"
                print(
                    f"{why}: resuming from the newest intact checkpoint {path} (step {step}); the optimizer "
                    f"state is new (Adam's moments start from zero, the learning rate goes on from step {step}).",
                    flush=True,
                )
                return ResumePoint(step=step, weights=path, iterations=step, optimizer_state=False)
            problems.append(problem)
        if problems:
            raise ResumeError(
                f"{problems[0]}, and {self.out_dir} has no intact checkpoint to resume from: delete "
                f"{self.path(BACKUP_DIR)} to train the run again from step 0, or use another output directory."
            )
        return None

    def remove_stale_temporaries(self):
        """Removes the temporary files a killed process of this run left (the package's own names only)."""
        for directory in (self.out_dir, self.path(BACKUP_DIR), self.path(CHECKPOINT_DIR)):
            if not os.path.isdir(directory):
                continue
            for name in os.listdir(directory):
                path = os.path.join(directory, name)
                if not is_temporary_name(name):
                    continue
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass

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


def load_resume_point(model, point, strategy, ema):
    """Puts the state of `point` into `model` (built, its optimizer built).

    A backup brings the weights and the optimizer state (checked:
    `check_optimizer_loaded`); a checkpoint brings the weights, and the
    optimizer's step is set to its step so that the schedule of §5.3 goes on
    (with `ema`, the moving average starts from the loaded weights).

    Raises:
        ResumeError: the file cannot be loaded (an HDF5 error), naming it.
    """
    try:
        with strategy.scope():
            model.load_weights(point.weights)
            if not point.optimizer_state:
                optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
                optimizer.iterations.assign(point.step)
                if ema:
                    compat.swap_ema_weights(model)  # the averages take the loaded weights ...
                    model.load_weights(point.weights)  # ... and so do the weights
    except (OSError, ValueError, KeyError) as error:
        raise ResumeError(
            f"{point.weights} cannot be loaded ({str(error).splitlines()[0] if str(error) else type(error).__name__}): "
            "delete it to resume from an older checkpoint, or use another output directory."
        ) from None
    if point.optimizer_state:
        check_optimizer_loaded(
            model, point.iterations, point.weights, "continue the run with the options it was started with"
        )


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
    options of `options.RESUME_FIXED` (data and its segmentation, batches,
    seed, schedule, precision, moving average) must be those the run was
    started with.

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
