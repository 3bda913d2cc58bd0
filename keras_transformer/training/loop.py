"""`train()`: the paper's training (Vaswani et al., 2017, §5) with `model.fit`, in named phases.

1. `_set_up`, once `train` has the strategy and the run directory (locked
   for the run's life: `training.lock`): configuration, dtype policy, resume
   point and seeds (and with `--init-from`, the other run's configuration
   and vocabulary).
2. `_prepare_data`: vocabulary (`spm.model`, reused if present), the training
   stream and its epoch length, the validation batches.
3. `_record_options`: `config.json` on a fresh run; a resume appends what it
   changed to `resumes.jsonl` and keeps the first options file.
4. `_build_model`: the model, Adam on the schedule of §5.3 and the metrics,
   under `strategy.scope()`, updated once every `accumulate_steps` batches
   (`training.accumulation`), with R-Drop's loss if asked (`training.rdrop`);
   the backup's weights on a resume, or the weights of `--init-from`'s run
   on a fresh start.
5. `_fit`: `model.fit` with the callbacks, up to the last step or the time budget.
6. `_finish`: the final float32 model, averaged over the last checkpoints
   (§6.1), validated, saved as `model.keras`; `curves.png`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import warnings
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_transformer import hardware
from keras_transformer.data import DataSpec, load_dataset
from keras_transformer.errors import ParameterError
from keras_transformer.losses import MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import create_optimizer
from keras_transformer.run_dir import (
    CHECKPOINT_DIR,
    CONFIG_FILENAME,
    CURVES_FILENAME,
    FINAL_MODEL_FILENAME,
    HISTORY_FILENAME,
    LOG_DIR,
    TOKENIZER_FILENAME,
    atomic_write_text,
    get_or_train_tokenizer,
    list_checkpoints,
    read_csv,
)
from keras_transformer.training import callbacks as run_callbacks
from keras_transformer.training import init_from
from keras_transformer.training import strategy as strategies
from keras_transformer.training.accumulation import accumulate_gradients
from keras_transformer.training.averaging import average_checkpoints, checkpoints_to_average
from keras_transformer.training.curves import plot_curves
from keras_transformer.training.inputs import check_inputs, tie_vocabulary_to_data
from keras_transformer.training.options import TrainingArgs, TrainingResult
from keras_transformer.training.rdrop import RDropDivergence, use_rdrop
from keras_transformer.training.run import ResumePoint, Run, check_resume_config, load_resume_point
from keras_transformer.training.stream import TrainingData
from keras_transformer.training.stream import fit_plan as _fit_plan
from keras_transformer.training.validation_bleu import ValidationBleu, read_validation_texts

logger = logging.getLogger(__name__)

RESUMES_FILENAME = "resumes.jsonl"


@dataclasses.dataclass
class _State:
    """What the phases hand on to each other."""

    args: TrainingArgs
    strategy: object
    run: Run
    model_config: object
    saved: dict = None  # the first run's config.json, on a resume
    precision: str = "float32"
    precision_reason: str = None
    start_step: int = 0
    resume: ResumePoint = None  # None on a fresh run
    tokenizer: object = None
    training_data: TrainingData = None
    validation: object = None
    validator: object = None  # ValidationBleu, with --validate-bleu-every
    steps_per_epoch: int = 0
    total_steps: int = 0
    model: object = None
    data_fingerprint: dict = None  # `inputs.check_inputs`


def train(args: TrainingArgs, callbacks: Sequence = (), strategy=None) -> TrainingResult:
    """Trains (or continues) the run in `args.output` with `model.fit`.

    A run killed at any point (even SIGKILL) and started again with the same
    command loads `backup/`, prints `resumed from step N` and continues: same
    weights, optimizer moments, learning-rate step, and (for corpora held in
    memory) the same batches in the same order as an uninterrupted run.
    Streamed corpora (`tfds:`, or more pairs than `data.MAX_DEFAULT_POOL_SIZE`)
    are one stream per process, across its `fit` calls; a resumed run starts a
    new stream, seeded by its step, rather than where the interrupted one was
    (`TrainingData.stream`). A resume with options that would change the experiment
    (`options.RESUME_FIXED`, the model config) is refused.

    Nothing is lost: the data files are checked before anything is written
    (`inputs.check_inputs`), and a start that fails removes the directory it
    created; one process at a time trains a run directory (`training.lock`);
    a backup that is missing or corrupt (its checksum) gives way to the newest
    intact checkpoint, with a new optimizer state (`Run.find_resume_point`),
    and no checkpoint is deleted but the run's own older ones; SIGINT and
    SIGTERM stop training at the end of the step, with a checkpoint.

    Args:
        args: a `TrainingArgs`.
        callbacks: extra Keras callbacks for `fit`.
        strategy: a `tf.distribute.Strategy` (default `strategy.get_strategy()`,
            created first because MultiWorkerMirroredStrategy must be set up
            before TensorFlow starts).

    Returns:
        a `TrainingResult`.

    Raises:
        ParameterError: an option or data file that cannot be used (named by
            its parameter: `data`, `output`, ...).
        training.lock.RunInUseError: another process trains in `args.output`.
        training.run.ResumeError: the run cannot go on from what its directory holds.
        training.callbacks.TrainingInterrupted: SIGINT or SIGTERM stopped
            training (a `KeyboardInterrupt`), after a checkpoint.
    """
    if strategy is None:
        strategy = strategies.get_strategy()
    strategies.check_time_budget(args, strategy)
    strategies.check_batch_multiple(args.batch_multiple, strategy.num_replicas_in_sync)
    fingerprint = check_inputs(args)  # before anything is written
    previous_policy = keras.mixed_precision.global_policy()
    created = not os.path.exists(os.path.abspath(args.output))
    run = Run(args, strategy)  # takes the run directory's lock, or refuses
    started = False
    try:
        state = _set_up(args, strategy, run)
        state.data_fingerprint = fingerprint
        _prepare_data(state)
        _record_options(state)
        _build_model(state)
        started = True
        monitor = _fit(state, callbacks)
        return _finish(state, monitor)
    except BaseException:
        if created and not started:  # a failed start leaves no directory behind
            run.close()
            run.remove_unstarted_directory()
        raise
    finally:
        run.close()
        keras.mixed_precision.set_global_policy(previous_policy)


def _set_up(args, strategy, run):
    """Configuration, dtype policy, resume point and seeds."""
    if args.init_from:
        model_config = init_from.model_config_from(args.init_from, args.model_config_overrides())
        if run.is_chief:
            init_from.adopt_vocabulary(run.run_dir, args.init_from)
    else:
        model_config = args.model_config()
    state = _State(args=args, strategy=strategy, run=run, model_config=model_config)
    state.saved = check_resume_config(run.run_dir, args, model_config)
    state.precision = args.precision
    if args.precision == "auto":
        state.precision, state.precision_reason = hardware.auto_precision()
    keras.mixed_precision.set_global_policy(state.precision)
    state.resume = run.find_resume_point()
    state.start_step = state.resume.step if state.resume else 0
    run.trained_seconds = state.resume.training_seconds if state.resume else 0.0
    # Dropout's random state is not part of the backup: a resumed run draws
    # new masks (seeded by the step) rather than replaying those of step 0.
    keras.utils.set_random_seed(args.seed + state.start_step)
    return state


def _prepare_data(state):
    """Vocabulary, training stream, epoch length and validation batches."""
    args, run = state.args, state.run
    spec = DataSpec.parse(args.data)
    num_replicas = args.batch_multiple or state.strategy.num_replicas_in_sync
    max_length = state.model_config.max_length
    if run.is_chief:
        tie_vocabulary_to_data(run.run_dir, state.data_fingerprint)
    state.tokenizer = get_or_train_tokenizer(
        run.run_dir, lambda: spec.training_texts(args.src, args.tgt), state.model_config.vocab_size
    )
    # A tfds split's files in another order for each resume: its stream starts elsewhere.
    text = spec.load("train", args.src, args.tgt, shuffle_seed=args.seed + state.start_step)
    state.training_data = TrainingData(args, state.tokenizer, text, num_replicas, max_length)
    state.steps_per_epoch = _steps_per_epoch(state, num_replicas)
    if state.steps_per_epoch < 1:
        raise ParameterError(
            "batch_tokens", f"({args.batch_tokens}) is more than the training data: no training batch."
        )
    run.steps_per_epoch = state.steps_per_epoch
    state.total_steps = args.max_steps or (args.epochs or 10) * state.steps_per_epoch
    if args.validation_split:
        validation_text = load_dataset(spec, args.validation_split, args.src, args.tgt)
        state.validation = state.training_data.validation(validation_text)
        if args.validate_bleu_every:
            sources, references = read_validation_texts(validation_text)
            state.validator = ValidationBleu(
                run,
                state.tokenizer,
                sources,
                references,
                args.validate_bleu_every,
                args.bleu_search,
                args.keep_best,
                args.early_stopping_patience,
                lang=args.tgt,
                start_step=state.start_step,
            )


def _steps_per_epoch(state, num_replicas):
    """A resumed run keeps its epoch length (counting costs a pass over the data)."""
    saved_data = (state.saved or {}).get("data", {})
    args, training_data = state.args, state.training_data
    if saved_data:
        if saved_data.get("batch_multiple") != num_replicas:
            print(
                f"Batch sizes are now multiples of {num_replicas} (were {saved_data.get('batch_multiple')}): "
                "the batches after the resume differ from those of the original run.",
                flush=True,
            )
        elif not (
            training_data.streamed
            and args.steps_per_epoch
            and args.steps_per_epoch != saved_data.get("steps_per_epoch")
        ):
            if saved_data.get("steps_per_epoch"):
                return saved_data["steps_per_epoch"]
    return training_data.steps_per_epoch()


def _record_options(state):
    """`config.json` on a fresh run; on a resume, the first one stays and `resumes.jsonl` grows."""
    args, run = state.args, state.run
    if not run.is_chief:
        return
    num_replicas = state.strategy.num_replicas_in_sync
    data = {
        "spec": args.data,
        "src": args.src,
        "tgt": args.tgt,
        "steps_per_epoch": state.steps_per_epoch,
        "total_steps": state.total_steps,
        "num_replicas": num_replicas,
        "batch_multiple": args.batch_multiple or num_replicas,
        "streamed": state.training_data.streamed,
    }
    if state.saved is None:
        atomic_write_text(
            os.path.join(run.run_dir, CONFIG_FILENAME),
            json.dumps(
                {
                    "model": state.model_config.to_dict(),
                    "training": args.to_dict(),
                    "data": data,
                    "precision": state.precision,
                    "tokenizer": TOKENIZER_FILENAME,
                    "final_model": FINAL_MODEL_FILENAME,
                },
                indent=2,
                sort_keys=True,
            ),
        )
        return
    first = state.saved.get("training", {})
    changed = {k: v for k, v in args.to_dict().items() if first.get(k, v) != v}
    with open(os.path.join(run.run_dir, RESUMES_FILENAME), "a", encoding="utf-8") as f:
        f.write(json.dumps({"step": state.start_step, "changed": changed, "data": data}, sort_keys=True) + "\n")


def _build_model(state):
    """Model, optimizer and metrics under the strategy's scope; the backup's weights on a resume."""
    args, strategy = state.args, state.strategy
    with strategy.scope():
        model = Transformer(state.model_config)
        divergence = [RDropDivergence()] if args.rdrop_alpha else []  # `rdrop_kl`
        model.compile(
            optimizer=create_optimizer(
                state.model_config.d_model,
                args.warmup_steps,
                args.lr_scale,
                cooldown=args.cooldown > 0,
                **(dict(use_ema=True, ema_momentum=args.ema) if args.ema else {}),
            ),
            metrics=[MaskedAccuracy()] + run_callbacks.count_metrics() + divergence,
            jit_compile=bool(args.xla),
            steps_per_execution=args.steps_per_execution,
        )
        model.build()
        model.optimizer.build(model.trainable_variables)
    rdrop = use_rdrop(model, args.rdrop_alpha, *divergence)  # alpha 0: the model as it is
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        element_spec = state.training_data.stream(0, state.steps_per_epoch).element_spec
        strategies.work_around_keras_multiworker(model, strategy, element_spec)
    accumulate_gradients(model, args.accumulate_steps, rdrop and rdrop.forward)  # K = 1: the model as it is
    resume = state.resume
    if resume is None and args.init_from:
        with strategy.scope():
            loaded = init_from.load_initial_weights(model, args.init_from, args.resume_optimizer)
        print(f"initialized from {args.init_from} ({loaded})", flush=True)
    if resume is not None:
        load_resume_point(model, resume, strategy, args.ema)
        print(f"resumed from step {resume.step}", flush=True)
        logger.info("Resumed %s from step %d (%s)", state.run.run_dir, resume.step, resume.weights)
    state.model = model


def _fit(state, callbacks):
    """`model.fit` in the calls of `_fit_plan`; returns the monitor."""
    args, run = state.args, state.run
    start, total = state.start_step, state.total_steps
    budget_spent = run.out_of_time()  # before training: the earlier processes' time alone
    to_train = start < total and not budget_spent
    if to_train:
        # Rows of the epoch about to be redone are rewritten. Checkpoints are left alone: a run
        # deletes only its own, older than its step, to keep the newest `keep_checkpoints`.
        run.truncate_logs(start)
    _print_plan(state)
    signals = run_callbacks.StopOnSignal()
    monitor = run_callbacks.RunMonitor(
        run,
        start,
        total,
        validator=state.validator,
        signals=signals,
        signal_at_step=run_callbacks.signal_at_step_from_environment(),
    )
    all_callbacks, keeper = run_callbacks.fit_callbacks(
        run, monitor, state.validation is not None, state.validator is not None, callbacks
    )
    if not to_train:
        reason = (
            f"Run already used its time budget of {args.time_budget:g} min (step {start})"
            if budget_spent
            else f"Run already trained to step {start} (>= {total})"
        )
        print(f"{reason}; nothing to train.", flush=True)
        return monitor
    with signals:
        _fit_calls(state, monitor, all_callbacks, keeper)
    if monitor.interrupted is not None:
        name = signal.Signals(monitor.interrupted).name
        print(
            f"{name}: stopped at step {monitor.step} with a checkpoint; run the same command again to go on "
            "from there.",
            flush=True,
        )
        raise run_callbacks.TrainingInterrupted(monitor.interrupted, monitor.step)
    if monitor.out_of_time and monitor.step < total:
        print(
            f"Time budget of {args.time_budget:g} min reached at step {monitor.step} "
            f"({run.training_seconds() / 60:.1f} min of training).",
            flush=True,
        )
    if monitor.stopped_on_nan:
        print(
            f"Training stopped at step {monitor.step}: the loss is NaN (TerminateOnNaN); no model.keras "
            "written. Try a lower --lr-scale or float32.",
            flush=True,
        )
    return monitor


def _fit_calls(state, monitor, all_callbacks, keeper):
    """The `model.fit` calls of `_fit_plan`, until the last step or a stop."""
    args, model, start, total = state.args, state.model, state.start_step, state.total_steps
    for initial_epoch, epochs, per_epoch in _fit_plan(start, total, state.steps_per_epoch, args.steps_per_execution):
        # With --steps-per-execution > 1, Keras runs whole executions of N steps, also past the
        # end of an epoch (or of the run): the data of each one-epoch call ends with the epoch,
        # which cuts its last execution short.
        count = per_epoch if args.steps_per_execution > 1 else None
        batches = state.training_data.batches(monitor.step, state.steps_per_epoch, count)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Your input ran out of data")
            model.fit(
                batches,
                initial_epoch=initial_epoch,
                epochs=epochs,
                steps_per_epoch=per_epoch,
                shuffle=False,
                validation_data=state.validation,
                validation_freq=args.validate_every,
                callbacks=all_callbacks,
                verbose=args.verbose,
            )
        stopped = monitor.stopped_on_nan or monitor.out_of_time or monitor.early_stopped
        if stopped or monitor.interrupted is not None or monitor.step >= total:
            break
        if args.ema:
            keeper.restore()


def _print_plan(state):
    args, model = state.args, state.model
    n_params = sum(int(np.prod(w.shape)) for w in model.trainable_weights)
    shown = (
        f"{state.precision}: --precision auto, {state.precision_reason}" if state.precision_reason else state.precision
    )
    budget = f" or {args.time_budget:g} min of training" if args.time_budget is not None else ""
    per_step = f" of {args.accumulate_steps} batches" if args.accumulate_steps > 1 else ""
    print(
        f"Training {args.preset} model ({n_params:,} parameters, {shown}) on {args.data} "
        f"{args.src}->{args.tgt}: {state.strategy.num_replicas_in_sync} replica(s), {state.steps_per_epoch} "
        f"steps{per_step}/epoch, steps {state.start_step}->{state.total_steps}{budget}, "
        f"run directory {state.run.run_dir}",
        flush=True,
    )


def _finish(state, monitor):
    """Final float32 model: averaged if asked (§6.1), validated, saved; `curves.png`."""
    args, run = state.args, state.run
    step = monitor.step
    keras.mixed_precision.set_global_policy("float32")
    final = Transformer(state.model_config, dtype="float32")
    final.build()
    chosen = checkpoints_to_average(list_checkpoints(run.out_dir), step, args.average_last, args.average_fraction)
    averaged = args.average_last > 1 and len(chosen) > 1 and not monitor.stopped_on_nan
    if args.ema and not monitor.stopped_on_nan:
        # The moving average is the final model (fit() wrote it into the model already,
        # unless nothing was trained in this process).
        state.model.optimizer.finalize_variable_values(state.model.trainable_variables)
        print(f"Final weights: the exponential moving average (decay {args.ema:g}).", flush=True)
    if averaged:
        final.set_weights(average_checkpoints(chosen, final))
        print(
            f"Averaged the last {len(chosen)} checkpoints: " + ", ".join(os.path.basename(p) for p in chosen),
            flush=True,
        )
    else:
        final.set_weights(state.model.get_weights())
    final.compile()
    val_metrics = None
    if state.validation is not None and not monitor.stopped_on_nan:
        if not averaged and monitor.last_validation and monitor.last_validation[0] == step:
            val_metrics = monitor.last_validation[1]  # the final weights were just validated
        else:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Your input ran out of data")
                logs = final.evaluate(state.validation, verbose=0, return_dict=True)
            val_metrics = {k: float(logs[k]) for k in ("loss", "accuracy") if k in logs}
        print(
            "Final model on the validation set: " + ", ".join(f"{k} {v:.4f}" for k, v in val_metrics.items()),
            flush=True,
        )
    if not monitor.stopped_on_nan:
        tmp = run.path(f"tmp-{os.getpid()}-{FINAL_MODEL_FILENAME}")
        final.save(tmp)
        os.replace(tmp, run.path(FINAL_MODEL_FILENAME))
    curves = plot_curves(run.out_dir)
    if run.is_chief:
        print(
            f"Run directory {run.run_dir}: {FINAL_MODEL_FILENAME}, {CHECKPOINT_DIR}/, {HISTORY_FILENAME}, "
            f"{LOG_DIR}/" + (f", {CURVES_FILENAME}" if curves else ""),
            flush=True,
        )
    speed = monitor.timed_tokens / monitor.timed_seconds if monitor.timed_seconds > 0 else None
    validator = state.validator
    return TrainingResult(
        run_dir=run.run_dir,
        model=final,
        tokenizer=state.tokenizer,
        step=step,
        resumed_from=state.start_step,
        history=read_csv(run.path(HISTORY_FILENAME)),
        val_metrics=val_metrics,
        tokens_per_sec=speed,
        stopped_on_nan=monitor.stopped_on_nan,
        early_stopped=monitor.early_stopped,
        val_bleu=validator.latest if validator else None,
        best_val_bleu=validator.best if validator else None,
        is_chief=run.is_chief,
    )
