"""Export a trained model as one SavedModel for TensorFlow Serving: strings in, translations out.

The SavedModel holds the whole `Translator` (`keras_transformer.inference.translator`):
SentencePiece tokenization, the Transformer and beam search (§6.1) in one
graph, so a client sends raw sentences and gets translated sentences back,
with no Python or tokenizer of its own:

    signature "serving_default"
        inputs:  inputs        tf.string  [None]   sentences
        outputs: translations  tf.string  [None]   one translation per sentence
                 scores        float32    [None]   log P / lp(|Y|) of each, for every beam size
                                                   (greedy too; 0 for blank input)

    signature "translate_with_prefix"
        inputs:  inputs           tf.string  [None]   sentences
                 target_prefixes  tf.string  [None]   the start of each translation ("" for none)
        outputs: as "serving_default"; each translation starts with its prefix
                 (`Translator.translate_with_prefix`, `inference.prefixes`)

    signature "translate_with_alignments"
        inputs:  inputs        tf.string  [None]   sentences
        outputs: as "serving_default", and
                 alignments    tf.string  [None]   Pharaoh "i-j ..." word alignments
                                                   (`Translator.translate_with_alignments`, `inference.alignments`)

It is the Translator's own `translate_strings` that is saved, so the served
answers are those of `Translator(...).translate_strings` in process, for
awkward input too (empty sentence -> empty translation; over-long sentence ->
truncated to the model's `max_length` tokens; invalid UTF-8 -> replaced by
U+FFFD; empty batch -> empty outputs).

Layout, the one TensorFlow Serving watches (`--model_base_path` = `output_dir`;
it serves the highest numbered version):

```text
output_dir/
    1/
        saved_model.pb        graph + signature (the SentencePiece model is in it too,
                              as the tokenizer op's attribute)
        variables/            the Transformer's weights
        assets/spm.model      the SentencePiece model, a tf.saved_model.Asset
        assets/export.json    decoding options and model config, for reference
        assets.extra/tf_serving_warmup_requests
                              requests TF Serving replays on loading (`serving_warmup`)
        fingerprint.pb
    2/ ...
```

Each export writes a new version (highest existing + 1, starting at 1)
unless `version` is given. The version is written under a temporary name
(`.tmp-<version>-<id>`, which TF Serving ignores) and moved into place when
complete, so a running server never loads a half-written model: renamed on a
local disk, copied with `saved_model.pb` last on a remote file system
(`gs://`, `s3://`, ...), where directories cannot be renamed. A failed export
leaves nothing behind.

Only ops that the stock `tensorflow/serving` binary registers are used: core
TensorFlow plus tensorflow-text's SentencePiece ops (TF Serving links
`@org_tensorflow_text//tensorflow_text:ops_lib`); no `PyFunc`, no XLA. Every
export is checked for Python ops (`check_serving_ops`).

What is exported: `export_run` (a training run directory), `reexport` (an
exported version, written again with this version's graph) and
`export_translator` (a `Translator` as it is); `export_saved_model` picks
one by its source, as `keras-transformer export --model RUN_DIR --output BASE` does.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
import time
import uuid

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.inference.export_dirs import (
    INFO_FILENAME,
    check_replaceable,
    is_export_dir,
    list_versions,
    next_version,
    publish_version,
    read_export_info,
    recorded_n_best,
)
from keras_transformer.inference.export_info import export_info, inherit_info
from keras_transformer.inference.export_sources import (
    DECODING_OPTION_NAMES,
    DecodingOptions,
    load_export,
    n_best_to_export,
    run_training_options,
    translator_of_export,
    translator_of_run,
    with_decoding,
)
from keras_transformer.inference.precision import resolve_decoding_precision
from keras_transformer.inference.serving_warmup import warmup_for_export
from keras_transformer.inference.signatures import (
    ALIGNMENT_SIGNATURE_NAME,
    INPUT_NAME,
    N_BEST_SIGNATURE_NAME,
    OUTPUT_NAMES,
    PREFIX_SIGNATURE_NAME,
    SIGNATURE_NAME,
)
from keras_transformer.run_dir import TOKENIZER_FILENAME

logger = logging.getLogger(__name__)

__all__ = [
    "SIGNATURE_NAME",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "DecodingOptions",
    "export_run",
    "export_saved_model",
    "export_translator",
    "load_export",
    "reexport",
    "is_export_dir",
    "read_export_info",
    "next_version",
    "list_versions",
    "saved_model_ops",
    "check_serving_ops",
]

# Ops that run Python: a model server has no Python interpreter to run them.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})


class _ServingModule(tf.Module):
    """What is saved: the Translator's traced `translate_strings` (and `translate_with_prefix`, ...), the resources
    they capture, the assets."""

    def __init__(self, translator, asset_paths, n_best=None):
        super().__init__(name="keras_transformer_serving")
        # The model's tf.Variables, not the Keras model: a Keras 3 variable wraps a
        # tf.Variable (`.value`), which is what the traced functions capture, but saving
        # the Keras variable itself exports a second, copied variable ("Variable_N") and
        # points the checkpoint restore at that copy. tf.saved_model.load copes; a
        # session-based loader -- TensorFlow Serving, saved_model_cli run -- restores the
        # copy and then fails with "Could not find variable ...". (keras.export.ExportArchive
        # likewise tracks the tf.Variables its endpoints capture.)
        self.model_variables = [_tf_variable(v) for v in translator.model.variables]
        # Not the Translator itself either: saving it would also save (and trace again)
        # its tf.function attributes, doubling the graph.
        self.tokenizer = translator.tokenizer
        # One trace, used both by the signature and as `loaded.translate_strings`.
        self.translate_strings = translator.translate_strings.get_concrete_function()
        self.serving_signatures = {SIGNATURE_NAME: self.translate_strings}
        self.translate_with_prefix = translator.translate_with_prefix.get_concrete_function()
        self.serving_signatures[PREFIX_SIGNATURE_NAME] = self.translate_with_prefix
        self.translate_with_alignments = translator.translate_with_alignments.get_concrete_function()
        self.serving_signatures[ALIGNMENT_SIGNATURE_NAME] = self.translate_with_alignments
        if n_best:
            spec = tf.TensorSpec([None], tf.string, name=INPUT_NAME)
            n_best_fn = tf.function(lambda inputs: translator.n_best_strings(inputs, n_best), input_signature=[spec])
            self.translate_n_best = n_best_fn.get_concrete_function()
            self.serving_signatures[N_BEST_SIGNATURE_NAME] = self.translate_n_best
        self.sentencepiece_model = tf.saved_model.Asset(asset_paths[TOKENIZER_FILENAME])
        self.export_info = tf.saved_model.Asset(asset_paths[INFO_FILENAME])


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable (a tf.Variable stays itself)."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, tf.Variable):
        raise TypeError(f"Cannot export {variable!r}: not backed by a tf.Variable (TensorFlow backend needed).")
    return value


# Graph checks -------------------------------------------------------------------------


def saved_model_ops(export_dir):
    """Every op type in a SavedModel: its graphs' nodes and all functions of their libraries."""
    proto = compat.serialized_saved_model(export_dir)
    ops = set()
    for meta_graph in proto.meta_graphs:
        graph = meta_graph.graph_def
        ops.update(node.op for node in graph.node)
        for function in graph.library.function:
            ops.update(node.op for node in function.node_def)
    return ops


def check_serving_ops(export_dir):
    """Raises ValueError if the SavedModel needs Python to run; returns its op types."""
    ops = saved_model_ops(export_dir)
    python_ops = sorted(ops & PYTHON_OPS)
    if python_ops:
        raise ValueError(
            f"{export_dir} contains Python ops ({', '.join(python_ops)}), which TensorFlow Serving cannot run."
        )
    return ops


# Export ---------------------------------------------------------------------------------


def export_run(
    run_dir,
    output_dir,
    decoding=None,
    *,
    checkpoint=None,
    dtype=None,
    version=None,
    overwrite=False,
    n_best=None,
    metadata=None,
    warmup_sentences="auto",
):
    """Writes a training run's model as a SavedModel to `output_dir/<version>/`; returns that path.

    Args:
        run_dir: the training run directory (`keras_transformer.run_dir`).
        output_dir: the model's base directory (TF Serving's `--model_base_path`),
            e.g. `saved_models/multi30k_en_de`; created if needed.
        decoding: `DecodingOptions` fixed in the export and recorded in
            `export.json`; those not given are §6.1's (beam 4, alpha 0.6, 50
            extra tokens, "exact" early stopping, the model's `max_length`).
        checkpoint: export this checkpoint (path or "latest") instead of the
            final `model.keras`.
        dtype: the dtype policy the exported graph computes in. "auto" or None
            (default) picks "bfloat16" where this machine computes it natively
            (a CPU with AVX512_BF16 / AMX-BF16, or GPUs of compute capability
            8.0+), else "float32" (`inference.precision.auto_decoding_precision`).
            Recorded in `export.json` ("precision", and "precision_choice"
            with the reason for "auto").
        version, overwrite, n_best, metadata, warmup_sentences: as
            `export_translator`; `warmup_sentences="auto"` takes the first
            validation sources of the run's data where they can be read. The
            run's training options (its `config.json`'s: the first run's; a
            resume's changes are in `resumes.jsonl`) are recorded as `training`.

    Returns:
        `output_dir/<version>` (str).

    Raises:
        FileExistsError: `version` exists and `overwrite` is False, or is no export.
        FileNotFoundError: `run_dir` is no directory.
        ValueError: `run_dir` is a SavedModel not written by this package, or
            a base directory of exported versions.
    """
    from keras_transformer.run_dir import weights_file

    output_dir, version = os.fspath(output_dir), _new_version(output_dir, version, overwrite)
    dtype, precision_choice = resolve_decoding_precision("auto" if dtype is None else dtype)
    write_warmup = warmup_for_export(warmup_sentences, run_dir)  # bad sentences are refused before the slow part
    translator = translator_of_run(run_dir, decoding, checkpoint, dtype)
    n_best = n_best_to_export(n_best, None, translator, run_dir)
    info = export_info(translator, version, n_best, precision_choice)
    info.update(source=os.fspath(run_dir), weights=weights_file(os.fspath(run_dir), checkpoint))
    training = run_training_options(os.fspath(run_dir))
    if training:
        info["training"] = training
    if metadata:
        info["metadata"] = metadata
    return _write_version(translator, output_dir, version, overwrite, info, n_best, write_warmup)


def reexport(
    export_dir,
    output_dir,
    decoding=None,
    *,
    dtype=None,
    version=None,
    overwrite=False,
    n_best=None,
    metadata=None,
    warmup_sentences="auto",
):
    """Writes an exported version's model again, with this version's graph, to `output_dir/<version>/`.

    The model is rebuilt from the export (`load_export`). What the export
    records holds unless given: its decoding options, precision, request
    limit, training options, "translate_n_best" signature, warm-up requests,
    and its metadata while the decoding options and precision stay (its
    scores would no longer hold otherwise: they move to `reexported_from`).

    Args:
        export_dir: one exported version (`output_dir/<version>` of an earlier export).
        output_dir: the base directory to write to (`export_dir`'s own, with
            its version and `overwrite`, replaces it in place).
        decoding: `DecodingOptions` to change; the others are those recorded.
        dtype: another precision to compute in (as `export_run`'s); None:
            the one it was exported in.
        version, overwrite, n_best, metadata, warmup_sentences: as
            `export_translator`; `n_best` None keeps the export's own N.

    Returns:
        `output_dir/<version>` (str).

    Raises:
        FileExistsError: `version` exists and `overwrite` is False, or is no export.
        ValueError: the export's variables do not match its model
            (`load_export`), or a recorded N exceeds a new, smaller beam.
    """
    output_dir, version = os.fspath(output_dir), _new_version(output_dir, version, overwrite)
    previous = read_export_info(export_dir)
    dtype, precision_choice = resolve_decoding_precision(dtype)
    if not dtype:
        precision_choice = previous.get("precision_choice")  # the precision it records, and why
    write_warmup = warmup_for_export(warmup_sentences, export_dir)
    translator = translator_of_export(export_dir, decoding, dtype)
    n_best = n_best_to_export(n_best, recorded_n_best(previous), translator, export_dir)
    info = export_info(translator, version, n_best, precision_choice)
    info.update(source=os.fspath(export_dir), weights=previous.get("weights"))
    inherit_info(info, previous)
    if metadata:
        info["metadata"] = metadata
    return _write_version(translator, output_dir, version, overwrite, info, n_best, write_warmup)


def export_translator(
    translator, output_dir, *, version=None, overwrite=False, n_best=None, metadata=None, warmup_sentences="auto"
):
    """Writes a `Translator` as it is (model, precision, decoding options) as a SavedModel; returns the path.

    Args:
        translator: the `Translator` to export (`export_sources.with_decoding`
            gives one with other decoding options).
        output_dir: the model's base directory (TF Serving's `--model_base_path`),
            e.g. `saved_models/multi30k_en_de`; created if needed.
        version: integer version; default: highest existing version + 1 (1 for
            a new directory).
        overwrite: replace an existing `version` (an export only) instead of raising.
        n_best: also export the signature "translate_n_best": inputs
            tf.string [B] -> translations tf.string [B, n_best] and scores
            float32 [B, n_best], best first (n_best at most the beam size);
            None or 0: no such signature.
        metadata: a JSON-serializable dict recorded as `metadata` in the
            export's `assets/export.json` (e.g. the scores and the machine of
            the run it comes from).
        warmup_sentences: source sentences for the requests TensorFlow
            Serving replays when it loads the version
            (`assets.extra/tf_serving_warmup_requests`, see
            `serving_warmup`), so that its first client request does not
            wait for TensorFlow's first-run work; None or "auto" (a
            Translator has no data of its own to take them from): none.

    Returns:
        `output_dir/<version>` (str).

    Raises:
        FileExistsError: `version` exists (or appears while the export
            runs) and `overwrite` is False.
        ValueError: the graph contains Python ops (never expected), or an
            `n_best` the translator cannot give.
    """
    output_dir, version = os.fspath(output_dir), _new_version(output_dir, version, overwrite)
    write_warmup = warmup_for_export(warmup_sentences, translator)
    n_best = n_best_to_export(n_best, None, translator, translator)
    info = export_info(translator, version, n_best, None)
    if metadata:
        info["metadata"] = metadata
    return _write_version(translator, output_dir, version, overwrite, info, n_best, write_warmup)


def export_saved_model(source, output_dir, **options):
    """Exports any source: `export_run`, `reexport` or `export_translator`, by what `source` is.

    The command line's `keras-transformer export` takes a run directory or an
    exported version alike; this is its library form.

    Args:
        source: a run directory, an exported version directory, or a `Translator`.
        output_dir: the model's base directory.
        **options: those of the function `source` picks. The decoding options
            may be given by name (`beam_size=1`) instead of as `decoding`;
            `checkpoint` only applies to a run directory and `dtype` not to a
            `Translator`, which keeps its model's precision.

    Returns:
        `output_dir/<version>` (str).

    Example:
        `export_saved_model("runs/multi30k", "saved_models/multi30k_en_de", beam_size=5)`
        is `export_run("runs/multi30k", "saved_models/multi30k_en_de", DecodingOptions(beam_size=5))`.
    """
    from keras_transformer.inference.translator import Translator

    named = {name: options.pop(name) for name in DECODING_OPTION_NAMES if name in options}
    decoding = dataclasses.replace(options.pop("decoding", None) or DecodingOptions(), **named)
    if isinstance(source, Translator):
        if options.pop("dtype", None) not in (None, "auto"):
            raise ValueError("dtype applies to a run directory; a Translator keeps its model's precision.")
        if options.pop("checkpoint", None) is not None:
            raise ValueError("checkpoint applies to a run directory, not to a Translator.")
        return export_translator(with_decoding(source, decoding), output_dir, **options)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"source must be a run directory, an exported version or a Translator, got {type(source).__name__}."
        )
    if is_export_dir(source):
        if options.pop("checkpoint", None) is not None:
            raise ValueError("checkpoint applies to a run directory, not to an exported SavedModel.")
        return reexport(source, output_dir, decoding, **options)
    return export_run(source, output_dir, decoding, **options)


def _new_version(output_dir, version, overwrite):
    """The version to write (default the next free one), refused before any work if it exists."""
    output_dir = os.fspath(output_dir)
    version = next_version(output_dir) if version is None else int(version)
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}.")
    final_dir = os.path.join(output_dir, str(version))
    if tf.io.gfile.exists(final_dir) and not overwrite:
        raise FileExistsError(
            f"{final_dir} already exists; pick another version, leave it out for the next free one "
            f"({next_version(output_dir)}), or pass overwrite=True."
        )
    check_replaceable(final_dir)
    return version


def _write_version(translator, output_dir, version, overwrite, info, n_best, write_warmup):
    """Saves `translator` with its assets (`info` as `export.json`) and publishes it as `output_dir/<version>`."""
    final_dir = os.path.join(output_dir, str(version))
    tf.io.gfile.makedirs(output_dir)
    # Written under a name TF Serving ignores (not an integer), then moved into place (`publish_version`).
    work_dir = os.path.join(output_dir, f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="keras_transformer_export_") as assets:
        asset_paths = {
            TOKENIZER_FILENAME: os.path.join(assets, TOKENIZER_FILENAME),
            INFO_FILENAME: os.path.join(assets, INFO_FILENAME),
        }
        with open(asset_paths[TOKENIZER_FILENAME], "wb") as f:
            f.write(translator.tokenizer.model_proto)
        with open(asset_paths[INFO_FILENAME], "w", encoding="utf-8") as f:
            json.dump(info, f, indent=2, sort_keys=True)
        module = _ServingModule(translator, asset_paths, n_best)
        try:
            tf.saved_model.save(module, work_dir, signatures=module.serving_signatures)
            check_serving_ops(work_dir)
            if write_warmup is not None:
                write_warmup(work_dir, translator.max_batch_size)
            publish_version(work_dir, final_dir, overwrite)
        except BaseException:
            if tf.io.gfile.exists(work_dir):
                tf.io.gfile.rmtree(work_dir)
            raise
    logger.info("Exported SavedModel %s in %.1f s", final_dir, time.perf_counter() - start)
    return final_dir
