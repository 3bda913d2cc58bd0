"""Checkpoint averaging (Vaswani et al., 2017, §6.1).

"For the base models, we used a single model obtained by averaging the last
5 checkpoints, which were written at 10-minute intervals. For the big models,
we averaged the last 20 checkpoints."
"""

from __future__ import annotations

import logging
import os

import numpy as np

from keras_transformer.run_dir import (
    CHECKPOINT_DIR,
    build_model,
    list_checkpoints,
    model_config_of_run,
    run_dir_of_checkpoint,
)

logger = logging.getLogger(__name__)


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
        model = build_model(model_config_of_run(run_dir_of_checkpoint(paths[0])), dtype="float32")
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


def checkpoints_to_average(checkpoints, last_step, count, fraction=None):
    """The checkpoints a run's final model averages: the newest `count`, within the run's final `fraction`.

    Args:
        checkpoints: `(step, path)` pairs, oldest first (`list_checkpoints`).
        last_step: the run's last step.
        count: K, the most checkpoints to average (§6.1: the last 5 or 20).
        fraction: None for the newest K whatever their steps; else only
            checkpoints written in the last `fraction` of the steps, at
            step >= (1 - fraction) * last_step. Checkpoints written every N
            steps span a fixed number of steps, which is a small part of a
            long run and most of a short one, where the early weights
            drag the average down; a fraction spans the same part of any run
            (the demo: its time budget buys a different number of steps
            on each CPU).

    Returns:
        the chosen paths, oldest first (at least the newest checkpoint).
    """
    checkpoints = [(step, path) for step, path in checkpoints if step <= last_step]
    if fraction is not None:
        start = (1.0 - fraction) * last_step
        checkpoints = [(step, path) for step, path in checkpoints if step >= start] or checkpoints[-1:]
    return [path for _, path in checkpoints[-max(count, 1):]]


def write_averaged_model(run_dir, last, output=None):
    """Averages the last `last` checkpoints of `run_dir` into a compiled float32 model file.

    Args:
        run_dir: run directory.
        last: K, the number of newest checkpoints to average.
        output: `.keras` (whole model) or `.weights.h5` path; default
            `RUN_DIR/model-avg{K}.keras`.

    Returns:
        (output path, list of averaged checkpoint paths).

    Raises:
        ValueError: `last` is below 1 (checked first).
        FileNotFoundError: the run has no checkpoints, or no config.json.
    """
    if last < 1:
        raise ValueError(f"last must be at least 1, got {last}.")
    checkpoints = list_checkpoints(run_dir)
    if not checkpoints:
        raise FileNotFoundError(f"no checkpoints in {os.path.join(run_dir, CHECKPOINT_DIR)}.")
    if len(checkpoints) < last:
        logger.warning("%s has %d checkpoints, fewer than --last %d; averaging all of them.",
                       run_dir, len(checkpoints), last)
    chosen = checkpoints_to_average(checkpoints, checkpoints[-1][0], last)
    model = build_model(model_config_of_run(run_dir), dtype="float32")
    model.set_weights(average_checkpoints(chosen, model))
    output = output or os.path.join(run_dir, f"model-avg{len(chosen)}.keras")
    if output.endswith(".weights.h5"):
        model.save_weights(output)
    else:
        model.compile()
        model.save(output)
    return output, chosen
