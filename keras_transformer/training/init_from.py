"""Fine-tuning and continued training: a new run that starts from another run's model (`--init-from`).

The new run takes the other run's model configuration, vocabulary
(`spm.model`) and weights (its final `model.keras`, else its latest
checkpoint), and trains on its own data with a fresh optimizer and learning
rate schedule (§5.3 warmup again), or, with `--resume-optimizer`, with the
other run's optimizer state and step (its `backup/`), so the schedule goes on
where it stopped. Only the regularization of the configuration may change
(dropout, attention dropout, label smoothing): anything else would not fit
the weights. A run directory that already has another vocabulary is refused.
"""

from __future__ import annotations

import os
import shutil

from keras_transformer.errors import ParameterError
from keras_transformer.run_dir import BACKUP_DIR, TOKENIZER_FILENAME, load_run, model_config_of_run
from keras_transformer.training.run import ResumeError, ResumePoint, check_optimizer_loaded

# TransformerConfig fields a fine-tuning run may set differently from the run it starts from.
ADJUSTABLE_FIELDS = ("dropout", "attention_dropout", "label_smoothing")


def model_config_from(init_dir, overrides):
    """The configuration of the run in `init_dir`, with `overrides` of `ADJUSTABLE_FIELDS` only."""
    config = model_config_of_run(init_dir)
    values = config.to_dict()
    fixed = sorted(k for k, v in overrides.items() if k not in ADJUSTABLE_FIELDS and values.get(k) != v)
    if fixed:
        raise ParameterError(
            "init_from",
            f"{init_dir}: the model's {', '.join(fixed)} cannot change when starting from its weights "
            f"(only {', '.join(ADJUSTABLE_FIELDS)} can).",
        )
    values.update({k: v for k, v in overrides.items() if k in ADJUSTABLE_FIELDS})
    return type(config).from_dict(values)


def adopt_vocabulary(run_dir, init_dir):
    """Copies `init_dir`'s `spm.model` into `run_dir`; refuses a `run_dir` with another vocabulary.

    The same vocabulary trained twice is accepted though its bytes differ
    (`data.tokenizer.vocabulary_difference`).
    """
    from keras_transformer.data.tokenizer import vocabulary_difference

    source = os.path.join(init_dir, TOKENIZER_FILENAME)
    target = os.path.join(run_dir, TOKENIZER_FILENAME)
    if not os.path.exists(source):
        raise FileNotFoundError(f"init_from {init_dir} has no {TOKENIZER_FILENAME}.")
    if os.path.exists(target):
        difference = vocabulary_difference(source, target)
        if difference:
            raise ParameterError(
                "output",
                f"{run_dir}: vocabulary mismatch: {target} is not the vocabulary of {init_dir}, whose weights "
                f"init_from loads ({difference}). Use a new output directory (the vocabulary is copied there).",
            )
        return
    os.makedirs(run_dir, exist_ok=True)
    shutil.copyfile(source, target)


def load_initial_weights(model, init_dir, resume_optimizer):
    """Puts `init_dir`'s weights (and with `resume_optimizer` its optimizer state) into `model`.

    Returns a description of what was loaded, for the log.
    """
    if resume_optimizer:
        point = ResumePoint.read(os.path.join(init_dir, BACKUP_DIR))
        if point is not None and point.problem():
            raise ResumeError(
                f"resume_optimizer: {point.problem()}; use resume_optimizer False to take the weights only."
            )
        if point is None:
            raise FileNotFoundError(
                f"resume_optimizer: {init_dir} has no {BACKUP_DIR}/ to resume from (state.json and its weights)."
            )
        model.load_weights(point.weights)
        check_optimizer_loaded(
            model,
            point.iterations,
            point.weights,
            f"use the ema of {init_dir} (its config.json), or resume_optimizer False",
        )
        return f"weights and optimizer state of step {point.step}"
    source, _ = load_run(init_dir, dtype="float32")
    model.set_weights(source.get_weights())
    return "weights"
