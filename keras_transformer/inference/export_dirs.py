"""An export's directory: its numbered versions, what `export.json` records, and a new version published whole.

TensorFlow Serving watches a model's base directory and serves its highest
numbered version (`output_dir/1/`, `output_dir/2/`, ...; see
`keras_transformer.inference.saved_model` for what a version holds).
"""

import json
import os
import re
import shutil
import uuid

import tensorflow as tf

INFO_FILENAME = "export.json"


def list_versions(output_dir):
    """Sorted integer versions of `output_dir` (its numbered subdirectories)."""
    if not tf.io.gfile.isdir(output_dir):
        return []
    names = (name.rstrip("/") for name in tf.io.gfile.listdir(output_dir))
    return sorted(int(name) for name in names if name.isdigit())


def next_version(output_dir):
    """1 for a new directory, else the highest existing version + 1."""
    versions = list_versions(output_dir)
    return versions[-1] + 1 if versions else 1


def is_export_dir(path):
    """Whether `path` is one exported version (`saved_model.pb` and `assets/export.json`), not a run directory."""
    path = os.fspath(path)
    return tf.io.gfile.exists(os.path.join(path, "saved_model.pb")) and tf.io.gfile.exists(
        os.path.join(path, "assets", INFO_FILENAME)
    )


def read_export_info(export_dir):
    """An exported version's `assets/export.json`, as a dict."""
    with tf.io.gfile.GFile(os.path.join(os.fspath(export_dir), "assets", INFO_FILENAME)) as f:
        return json.load(f)


def recorded_n_best(info):
    """The N of an export's "translate_n_best" signature, or None."""
    signature = info.get("n_best_signature")
    if not signature:
        return None
    if "n_best" in signature:
        return signature["n_best"]
    # Exports written before export.json recorded N: read it from the outputs' shape.
    match = re.search(r"\[None, (\d+)\]", signature["outputs"]["translations"])
    return int(match.group(1)) if match else None


def publish_version(work_dir, final_dir, overwrite):
    """Moves the complete version `work_dir` to `final_dir`; an existing `final_dir` only with `overwrite`.

    A local version is renamed into place, so a version another export
    created meanwhile is never replaced without `overwrite`. On a remote file
    system, where directories cannot be renamed, the files are copied with
    `saved_model.pb` last (what TF Serving needs to load a version).
    """
    exists_error = FileExistsError(
        f"{final_dir} already exists (written while this export ran); pick another "
        f"version, or pass overwrite=True (--overwrite)."
    )
    if "://" in final_dir:
        if tf.io.gfile.exists(final_dir):
            if not overwrite:
                raise exists_error
            tf.io.gfile.rmtree(final_dir)
        files = [f"{root.rstrip('/')}/{name}" for root, _, names in tf.io.gfile.walk(work_dir) for name in names]
        files.sort(key=lambda path: os.path.basename(path) == tf.saved_model.SAVED_MODEL_FILENAME_PB)
        for path in files:
            target = final_dir + path[len(work_dir) :]
            tf.io.gfile.makedirs(os.path.dirname(target))
            tf.io.gfile.copy(path, target)
        tf.io.gfile.rmtree(work_dir)
        return
    replaced = None
    if overwrite and os.path.lexists(final_dir):
        replaced = f"{os.path.dirname(final_dir)}/.old-{os.path.basename(final_dir)}-{uuid.uuid4().hex[:8]}"
        os.rename(final_dir, replaced)
    try:
        os.rename(work_dir, final_dir)  # fails if final_dir appeared and is not empty
    except OSError as error:
        if replaced is not None:
            os.rename(replaced, final_dir)
        raise exists_error from error
    if replaced is not None:
        shutil.rmtree(replaced, ignore_errors=True)
