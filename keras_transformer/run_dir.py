"""The run directory: what training writes and what inference and export read.

Layout (`keras-transformer train --output RUN_DIR`):

```text
config.json      model TransformerConfig + training options + data spec
spm.model        the SentencePiece vocabulary (reused if present)
spm.data.json    the data it was learned on: spec, languages, files' SHA-256
checkpoints/     ckpt-00001000.weights.h5 ...: model weights every
                 --checkpoint-every steps (the last --keep-checkpoints kept,
                 at least --average-last)
backup/          full training state (model + optimizer) of the last
                 checkpoint, for resuming; written atomically, its
                 checksum in backup/state.json
logs/            TensorBoard (train/ and validation/)
history.csv      one row per epoch (keras.callbacks.CSVLogger)
steps.csv        loss, accuracy, learning rate and tokens/s every --log-every steps
bleu.csv         validation BLEU every --validate-bleu-every steps (with it)
curves.png       training and validation loss/accuracy (written at the end)
model.keras      the final model (averaged if --average-last > 1), float32
.lock            held by the training process (its pid inside) for its life
```

This module is shared by `keras_transformer.training` (which writes it) and
`keras_transformer.inference` (which reads it). Inference imports nothing of
training; training uses inference's `Translator` for its validation BLEU.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from keras_transformer import compat

if TYPE_CHECKING:
    from keras_transformer.data.tokenizer import Tokenizer

CONFIG_FILENAME = "config.json"
# The SentencePiece vocabulary: a run directory's, and the asset an export carries (assets/spm.model).
TOKENIZER_FILENAME = "spm.model"
# Beside it: the fingerprint of the training data it was learned on (`training.inputs`).
TOKENIZER_DATA_FILENAME = "spm.data.json"
FINAL_MODEL_FILENAME = "model.keras"
HISTORY_FILENAME = "history.csv"
STEPS_FILENAME = "steps.csv"
BLEU_FILENAME = "bleu.csv"
CURVES_FILENAME = "curves.png"
CHECKPOINT_DIR = "checkpoints"
BACKUP_DIR = "backup"
BACKUP_STATE_FILENAME = "state.json"  # in BACKUP_DIR: the step, the weights file and its checksum
LOG_DIR = "logs"

_CHECKPOINT_RE = re.compile(r"ckpt-(\d+)\.weights\.h5$")
# The package's temporary names: `tmp-PID-NAME` (weights, models, the vocabulary's directory) and
# `NAME.tmp-PID` (`atomic_write_text`, logs, curves).
_TEMPORARY_RE = re.compile(r"^tmp-\d+-.|\.tmp-\d+$")


def is_temporary_name(name):
    """Whether a file name is one of the package's temporary names (`tmp-PID-NAME` or `NAME.tmp-PID`).

    Example:
        >>> [is_temporary_name(n) for n in ("tmp-41-model.keras", "config.json.tmp-41", "tmp-notes.txt")]
        [True, True, False]
    """
    return bool(_TEMPORARY_RE.search(name))


def atomic_write_text(path, text):
    """Writes `text` to `path` through a temporary file, so a reader never sees half of it."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_csv(path):
    """The rows of one of the run's CSV logs (history.csv, steps.csv, bleu.csv) as dicts; [] if absent."""
    import csv

    if not os.path.exists(path):
        return []
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def checkpoint_path(directory, step):
    """`directory/ckpt-{step:08d}.weights.h5`."""
    return os.path.join(directory, f"ckpt-{step:08d}.weights.h5")


def file_sha256(path):
    """The SHA-256 of a file's bytes, as hex: the checksum `backup/state.json` records for its weights."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def weights_file_problem(path, sha256=None):
    """Why the weights file `path` cannot be trusted, or None if it is intact.

    With `sha256` (recorded when the file was written), the file's checksum
    must match it; without, every dataset of the HDF5 file must read back
    (h5py's own checks: a truncated file or a broken structure fails, bytes
    overwritten inside a dataset do not).

    Example:
        >>> weights_file_problem("/nonexistent/ckpt-00000001.weights.h5")
        '/nonexistent/ckpt-00000001.weights.h5 is missing'
    """
    if not os.path.isfile(path):
        return f"{path} is missing"
    if sha256 is not None:
        try:
            actual = file_sha256(path)
        except OSError as error:
            return f"{path} cannot be read ({error.strerror or error})"
        return None if actual == sha256 else f"{path} is corrupt (its checksum is not the one recorded when written)"
    import h5py

    def read(name, item):
        if isinstance(item, h5py.Dataset):
            item[()]

    try:
        with h5py.File(path, "r") as f:
            f.visititems(read)
    except (OSError, KeyError, RuntimeError, ValueError) as error:
        return f"{path} is corrupt ({str(error).splitlines()[0] if str(error) else type(error).__name__})"
    return None


def temporary_path(path):
    """Where this process writes `path` before renaming it into place: `tmp-PID-NAME` beside it.

    `is_temporary_name` recognizes the name, so a run removes what a killed process left.
    """
    return os.path.join(os.path.dirname(path), f"tmp-{os.getpid()}-{os.path.basename(path)}")


def save_model_weights(model, path):
    """Model weights only (no optimizer) to a `.weights.h5`, atomically."""
    tmp = temporary_path(path)
    compat.save_weights_without_optimizer(model, tmp)
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


def read_config(run_dir):
    """The run's `config.json` as a dict."""
    path = os.path.join(run_dir, CONFIG_FILENAME)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{run_dir} is not a run directory: it has no {CONFIG_FILENAME}.")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def model_config_of_run(run_dir):
    """The run's `TransformerConfig`."""
    from keras_transformer.config import TransformerConfig

    return TransformerConfig.from_dict(read_config(run_dir)["model"])


def run_dir_of_checkpoint(path):
    """The run directory a checkpoint file belongs to."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.basename(directory) == CHECKPOINT_DIR:
        directory = os.path.dirname(directory)
    return directory


def build_model(config, dtype=None):
    """A built `Transformer` of `config` under the dtype policy `dtype` (default: the global one)."""
    from keras_transformer.model import Transformer

    model = Transformer(config, dtype=dtype) if dtype else Transformer(config)
    model.build()
    return model


def weights_file(run_dir, checkpoint=None):
    """The file `load_run(run_dir, checkpoint)` takes the weights from: `model.keras` or a checkpoint's path.

    Raises:
        FileNotFoundError: the run has neither, or `checkpoint` does not exist.
    """
    final = os.path.join(run_dir, FINAL_MODEL_FILENAME)
    if checkpoint is None and os.path.exists(final):
        return final
    if checkpoint in (None, "latest"):
        checkpoints = list_checkpoints(run_dir)
        if not checkpoints:
            raise FileNotFoundError(f"{run_dir} has neither {FINAL_MODEL_FILENAME} nor checkpoints.")
        return checkpoints[-1][1]
    if not os.path.exists(checkpoint):
        raise FileNotFoundError(f"Checkpoint {checkpoint} does not exist.")
    return checkpoint


def load_run(run_dir, checkpoint=None, dtype=None):
    """The model and tokenizer of a run directory: `(Transformer, Tokenizer)`.

    Loads `model.keras` when the run has finished; otherwise (or with
    `checkpoint`, a path or "latest") the config and a checkpoint's weights
    (`weights_file`). `dtype`: a dtype policy for the returned model
    ("float32", "mixed_bfloat16", ...); default: `model.keras`'s own
    (float32 whatever the training precision: training saves it so), and
    float32 for a checkpoint.
    """
    import keras

    from keras_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(os.path.join(run_dir, TOKENIZER_FILENAME))
    path = weights_file(run_dir, checkpoint)
    if path == os.path.join(run_dir, FINAL_MODEL_FILENAME):
        # compile=False then compile(): compile_from_config would build the optimizer,
        # allocating Adam's moments that a model loaded to translate or evaluate never uses.
        model = keras.saving.load_model(path, compile=False)
        if dtype is not None and keras.dtype_policies.get(dtype).name != model.dtype_policy.name:
            weights = model.get_weights()
            model = build_model(model.config, dtype=dtype)
            model.set_weights(weights)
        model.compile()
        return model, tokenizer
    checkpoint = path
    model = build_model(model_config_of_run(run_dir), dtype=dtype or "float32")
    model.load_weights(checkpoint)
    model.compile()
    return model, tokenizer


def get_or_train_tokenizer(
    run_dir: str | os.PathLike,
    texts_fn: Callable[[], Iterable[str]],
    vocab_size: int = 8000,
    **train_kwargs,
) -> Tokenizer:
    """Loads the run's vocabulary (`TOKENIZER_FILENAME`) if it exists, else trains it and saves it there.

    Args:
        run_dir: run directory (created if needed).
        texts_fn: zero-argument callable returning the training sentences; only
            called when training is needed (so resuming a run reads no text).
        vocab_size: requested vocabulary size.
        **train_kwargs: forwarded to `keras_transformer.data.tokenizer.train_tokenizer`.

    Raises:
        ValueError: if a cached model exists with a different vocabulary size
            (its ids would not match a model configured for `vocab_size`).
    """
    import logging
    import tempfile

    from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer

    logger = logging.getLogger(__name__)
    run_dir = os.fspath(run_dir)
    path = os.path.join(run_dir, TOKENIZER_FILENAME)
    if os.path.exists(path):
        tokenizer = Tokenizer(path)
        if tokenizer.vocab_size != vocab_size:
            raise ValueError(
                f"{path} has vocab_size {tokenizer.vocab_size}, but {vocab_size} was "
                "requested; use another run directory or delete the file."
            )
        logger.info("Reusing tokenizer %s (vocab_size %d)", path, vocab_size)
        return tokenizer
    os.makedirs(run_dir, exist_ok=True)
    # Train under a temporary prefix and rename, so an interrupted run never
    # leaves a half-written spm.model that the next run would silently reuse.
    with tempfile.TemporaryDirectory(dir=run_dir, prefix=f"tmp-{os.getpid()}-spm-") as tmp:
        prefix = os.path.join(tmp, "spm")
        train_tokenizer(texts_fn(), prefix, vocab_size, **train_kwargs)
        os.replace(prefix + ".vocab", os.path.join(run_dir, "spm.vocab"))
        os.replace(prefix + ".model", path)
    logger.info("Trained tokenizer %s (vocab_size %d)", path, vocab_size)
    return Tokenizer(path)
