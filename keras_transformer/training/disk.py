"""Disk space for a run's checkpoints: checked before each write, and a full disk ended as a resumable stop.

A checkpoint writes the backup (model and optimizer state, `backup/`) and
the model-only checkpoint (`checkpoints/`), each to a temporary file renamed
into place, so a write that fails leaves the previous ones whole. Two things
could still go wrong on a full disk: HDF5 failing inside its C library (which
can end the process without a Python exception), and a temporary file left
behind. So `training.run.Run.save_checkpoint` asks `check_free_space` first (about
what the two files will take, from `state_bytes`), and runs the writes under
`stop_when_disk_full`, which removes the temporary files of a write that
failed anyway. Either way training ends with `DiskFullError`: one line
naming the directory, the step the run can resume from, and the way on
(free space, run the same command again).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil

import numpy as np

# HDF5's structures per variable (a dataset's header, its group and name): what dominates a small model's file.
_HDF5_BYTES_PER_VARIABLE = 1536
# Beyond the estimate: the config and state files written beside the weights, the file system's blocks.
_MARGIN_BYTES = 16 * 2**20
_MARGIN_FACTOR = 1.25
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(OSError):
    """The disk of a run has no room for its next checkpoint; the run stopped and can resume.

    An `OSError` with errno `ENOSPC`, whose `filename` is the directory and
    `strerror` says what was being written, the space, and how to go on.
    """

    def __init__(self, directory, message):
        super().__init__(errno.ENOSPC, message, directory)


def state_bytes(model, optimizer=True):
    """Bytes of the model's (and its optimizer's) variables: about what a backup's weights file holds.

    Args:
        model: a built Keras model, with or without a built optimizer.
        optimizer: count the optimizer's variables too (a backup); False for
            the model's weights only (a checkpoint).

    Returns:
        the sum over `model.weights` (and the optimizer's variables) of their
        sizes times their item sizes (2 for bfloat16), and of HDF5's
        structures for each.
    """
    variables = list(model.weights)
    if optimizer:
        variables += list(getattr(getattr(model, "optimizer", None), "variables", None) or [])
    total = _HDF5_BYTES_PER_VARIABLE * len(variables)
    for variable in variables:
        try:
            itemsize = np.dtype(str(variable.dtype)).itemsize
        except TypeError:  # bfloat16 has no NumPy dtype
            itemsize = 2
        total += int(np.prod(variable.shape, dtype=np.int64)) * itemsize
    return total


def needed_bytes(payload_bytes):
    """`payload_bytes` with the margin a write needs beyond its variables (HDF5 overhead, state files)."""
    return int(payload_bytes * _MARGIN_FACTOR) + _MARGIN_BYTES


def check_free_space(directory, payload_bytes, what, resume_hint):
    """Refuses, before anything is written, a write that the disk of `directory` has no room for.

    Args:
        directory: where the files go (an existing directory).
        payload_bytes: what the files hold (`state_bytes`); the margin of
            `needed_bytes` is added.
        what: the files, for the message ("the checkpoint of step 600").
        resume_hint: how the run goes on, for the message.

    Raises:
        DiskFullError: fewer bytes are free than `needed_bytes(payload_bytes)`.
    """
    needed = needed_bytes(payload_bytes)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise DiskFullError(
            directory, f"{_megabytes(free)} free, {what} needs about {_megabytes(needed)}: {resume_hint}"
        )


def is_disk_full(error):
    """Whether an exception says the disk (or the user's quota) is full, as `OSError` or as HDF5 words it."""
    if isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS:
        return True
    text = str(error).lower()
    return "no space left on device" in text or "disk quota exceeded" in text


@contextlib.contextmanager
def stop_when_disk_full(directory, temporaries, what, resume_hint):
    """Runs a write; if the disk is full, removes its temporary files and raises `DiskFullError`.

    Args:
        directory: where the files go, named in the message.
        temporaries: paths the write may have left half-written (removed if present).
        what: the files, for the message.
        resume_hint: how the run goes on, for the message.

    Raises:
        DiskFullError: the write failed on a full disk. Other errors pass unchanged.
    """
    try:
        yield
    except Exception as error:
        if not is_disk_full(error):
            raise
        for path in temporaries:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        raise DiskFullError(directory, f"no space left on the device writing {what}: {resume_hint}") from error


def _megabytes(count):
    return f"{count / 2**20:.0f} MB" if count >= 2**20 else f"{count} bytes"
