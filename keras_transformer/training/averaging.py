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
    CONFIG_FILENAME,
    TOKENIZER_FILENAME,
    build_model,
    list_checkpoints,
    model_config_of_run,
    read_config,
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

    Raises:
        ValueError: no paths, or checkpoints of runs with different models
            or vocabularies (`check_same_model`).
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint path.")
    check_same_model(paths)
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


def _model_section(run_dir):
    """The run's model configuration as a dict without the training-only fields, or None without config.json."""
    from keras_transformer.config import TransformerConfig
    from keras_transformer.training.init_from import ADJUSTABLE_FIELDS

    if not os.path.exists(os.path.join(run_dir, CONFIG_FILENAME)):
        return None
    values = TransformerConfig.from_dict(read_config(run_dir)["model"]).to_dict()
    return {k: v for k, v in values.items() if k not in ADJUSTABLE_FIELDS}


def _difference(first, other, path, other_path):
    """What differs between the runs `first` and `other` (of checkpoints `path`, `other_path`), or None."""
    from keras_transformer.data.tokenizer import vocabulary_difference

    for name in (CONFIG_FILENAME, TOKENIZER_FILENAME):
        has = os.path.exists(os.path.join(first, name)), os.path.exists(os.path.join(other, name))
        if has[0] != has[1]:
            return f"the run of {(path, other_path)[has[1]]} has a {name}, the other's has none"
    a, b = _model_section(first), _model_section(other)
    if a != b:
        fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        return "model configurations differ: " + ", ".join(f"{k} {a.get(k)!r} vs {b.get(k)!r}" for k in fields)
    vocabularies = os.path.join(first, TOKENIZER_FILENAME), os.path.join(other, TOKENIZER_FILENAME)
    if os.path.exists(vocabularies[0]):
        difference = vocabulary_difference(*vocabularies)
        if difference:
            return f"vocabularies ({TOKENIZER_FILENAME}) differ: {difference}"
    return None


def check_same_model(paths):
    """Refuses checkpoints of runs whose models or vocabularies differ from the first checkpoint's run.

    Weights of the same shapes from another configuration (say another
    activation) or another vocabulary would load without error and average
    into nonsense. Training-only fields (dropout, label smoothing) may differ,
    as between a run and its fine-tuning (`training.init_from`).

    Raises:
        ValueError: naming both checkpoints and what differs.
    """
    first = run_dir_of_checkpoint(paths[0])
    checked = {first}
    for path in paths[1:]:
        other = run_dir_of_checkpoint(path)
        if other in checked:
            continue
        checked.add(other)
        difference = _difference(first, other, paths[0], path)
        if difference:
            raise ValueError(
                f"Cannot average {paths[0]} with {path}: they are checkpoints of different models ({difference})."
            )


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
    return [path for _, path in checkpoints[-max(count, 1) :]]


def write_averaged_model(run_dir, last, output=None):
    """Averages the last `last` checkpoints of `run_dir` into a compiled float32 model file.

    Args:
        run_dir: run directory.
        last: K, the number of newest checkpoints to average.
        output: `.keras` (whole model) or `.weights.h5` path; default
            `RUN_DIR/model-avg{N}.keras`, N the checkpoints averaged (K, or
            all of them when the run has fewer).

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
        logger.warning(
            "%s has %d checkpoints, fewer than --last %d; averaging all of them.", run_dir, len(checkpoints), last
        )
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
