"""An export's directory: its numbered versions, what `export.json` records, a new version published whole.

And what a SavedModel's graph may do beyond computing (`unsafe_ops`): read
or write files, or run Python, which `keras-transformer translate` refuses
to load unless trusted.

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

from keras_transformer import compat

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

    Only an export is replaced (`check_replaceable`).

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
            check_replaceable(final_dir)
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
        check_replaceable(final_dir)
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


def check_replaceable(path):
    """Refuses to let an export replace `path` unless it is itself an export of this project.

    `--overwrite` replaces a version directory whole: one that holds no
    `assets/export.json` (a user's notes, another tool's model, a file) is
    not this project's to delete.

    Raises:
        FileExistsError: `path` exists and is not an exported version.
    """
    path = os.fspath(path)
    if tf.io.gfile.exists(path) and not tf.io.gfile.exists(os.path.join(path, "assets", INFO_FILENAME)):
        raise FileExistsError(
            f"{path} exists and is not a keras-transformer export (no assets/{INFO_FILENAME}): "
            "overwrite replaces only exports; move it away or pick another version."
        )


# Ops that read or write files, or run Python, in a SavedModel's graph: a model that holds one can do more
# than compute translations (`unsafe_ops`).
UNSAFE_OPS = frozenset(
    {
        # files
        "ReadFile",
        "WriteFile",
        "MatchingFiles",
        "ImmutableConst",
        "Save",
        "SaveV2",
        "SaveSlices",
        "Restore",
        "RestoreV2",
        "RestoreSlice",
        "MergeV2Checkpoints",
        "InitializeTableFromTextFile",
        "InitializeTableFromTextFileV2",
        "WholeFileReader",
        "WholeFileReaderV2",
        "TextLineReader",
        "TextLineReaderV2",
        "TFRecordReader",
        "TFRecordReaderV2",
        "FixedLengthRecordReader",
        "FixedLengthRecordReaderV2",
        "IdentityReader",
        "IdentityReaderV2",
        "LMDBReader",
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
        "SaveDataset",
        "SaveDatasetV2",
        "LoadDataset",
        "SnapshotDataset",
        "SnapshotDatasetV2",
        "DatasetToTFRecord",
        "CacheDatasetV2",
        "CreateSummaryFileWriter",
        "CreateSummaryDbWriter",
        "WriteSummary",
        "WriteScalarSummary",
        "WriteHistogramSummary",
        "WriteImageSummary",
        "WriteAudioSummary",
        "WriteGraphSummary",
        "WriteRawProtoSummary",
        "DebugIdentity",
        "DebugIdentityV2",
        "DebugIdentityV3",
        "DebugNanCount",
        "DebugNumericSummary",
        "DebugNumericSummaryV2",
        # Python
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
    }
)


def unsafe_ops(saved_model_dir):
    """The file-system and Python ops (`UNSAFE_OPS`) a SavedModel's graph holds, as sorted "Op (where)" strings.

    Every node of every meta graph is read, and every function of its
    library, nested ones too. Only the functions that the graph's own saver
    calls to save and restore variables are left out (every SavedModel has
    them, with `SaveV2`, `RestoreV2` and `MergeV2Checkpoints`; loading
    restores the variables without them), and only while nothing else
    calls them.

    Args:
        saved_model_dir: a directory holding `saved_model.pb`.

    Returns:
        A sorted list, empty for a graph that only computes.
    """
    saved_model = compat.serialized_saved_model(saved_model_dir)
    found = set()
    for meta_graph in saved_model.meta_graphs:
        graph = meta_graph.graph_def
        functions = {function.signature.name: function for function in graph.library.function}
        saver = meta_graph.saver_def
        saver_nodes = {saver.save_tensor_name.split(":")[0], saver.restore_op_name.split(":")[0]} - {""}
        used = _called([n for n in graph.node if n.name not in saver_nodes], functions)
        used |= _closure(meta_graph.object_graph_def.concrete_functions, functions)
        saver_only = _called([n for n in graph.node if n.name in saver_nodes], functions) - used
        found.update(f"{node.op} (node {node.name})" for node in graph.node if _unsafe(node))
        for name, function in functions.items():
            if name not in saver_only:
                found.update(f"{node.op} (function {name})" for node in function.node_def if _unsafe(node))
    return sorted(found)


def _unsafe(node):
    """Whether a `NodeDef` touches files or runs Python (a `PrintV2` too, when it prints to a file)."""
    if node.op in UNSAFE_OPS:
        return True
    return node.op == "PrintV2" and "output_stream" in node.attr and node.attr["output_stream"].s.startswith(b"file:")


def _called(nodes, functions):
    """The library functions that `nodes` call, directly or through the functions they call."""
    return _closure({name for node in nodes for name in _callees(node)}, functions)


def _closure(names, functions):
    """`names` (those of `functions`) and every function they call, transitively."""
    seen, todo = set(), [name for name in names if name in functions]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(n for node in functions[name].node_def for n in _callees(node) if n in functions)
    return seen


def _callees(node):
    """The function names a `NodeDef` may call: its op (a library function is an op) and its function attrs."""
    yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (function.name for function in value.list.func)
