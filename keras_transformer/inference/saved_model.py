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

It is the Translator's own `translate_strings` that is saved, so the served
answers are those of `Translator(...).translate_strings` in process, for
awkward input too (empty sentence -> empty translation; over-long sentence ->
truncated to the model's `max_length` tokens; invalid UTF-8 -> replaced by
U+FFFD; empty batch -> empty outputs).

Layout, the one TensorFlow Serving watches (`--model_base_path` = `output_dir`;
it serves the highest numbered version)::

    output_dir/
        1/
            saved_model.pb        graph + signature (the SentencePiece model is in it too,
                                  as the tokenizer op's attribute)
            variables/            the Transformer's weights
            assets/spm.model      the SentencePiece model, a tf.saved_model.Asset
            assets/export.json    decoding options and model config, for reference
            fingerprint.pb
        2/ ...

Each export writes a new version (highest existing + 1, starting at 1)
unless `version` is given. The version is written under a temporary name and
renamed into place when complete, so a running server never loads a
half-written model.

Only ops that the stock `tensorflow/serving` binary registers are used: core
TensorFlow plus tensorflow-text's SentencePiece ops (TF Serving links
`@org_tensorflow_text//tensorflow_text:ops_lib`); no `PyFunc`, no XLA. Every
export is checked for Python ops (`saved_model_ops`).

    from keras_transformer.inference import export_saved_model
    path = export_saved_model("runs/multi30k", "saved_models/multi30k_en_de")   # .../1

    keras-transformer export runs/multi30k --output saved_models/multi30k_en_de
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import time
import uuid

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    EXTRA_OUTPUT_LENGTH,
)
from keras_transformer.inference.precision import resolve_decoding_precision

logger = logging.getLogger(__name__)

__all__ = [
    "SIGNATURE_NAME",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "ASSET_FILENAME",
    "export_saved_model",
    "load_export",
    "is_export_dir",
    "next_version",
    "list_versions",
    "saved_model_ops",
    "check_serving_ops",
]

SIGNATURE_NAME = "serving_default"
N_BEST_SIGNATURE_NAME = "translate_n_best"  # with n_best: the N best translations of each input
INPUT_NAME = "inputs"
OUTPUT_NAMES = ("translations", "scores")
ASSET_FILENAME = "spm.model"
INFO_FILENAME = "export.json"

# Ops that run Python: a model server has no Python interpreter to run them.
PYTHON_OPS = frozenset({"PyFunc", "PyFuncStateless", "EagerPyFunc"})



class _ServingModule(tf.Module):
    """What is saved: the Translator's traced `translate_strings`, the resources it captures, the assets."""

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
        if n_best:
            spec = tf.TensorSpec([None], tf.string, name="inputs")
            n_best_fn = tf.function(lambda inputs: translator.n_best_strings(inputs, n_best), input_signature=[spec])
            self.translate_n_best = n_best_fn.get_concrete_function()
            self.serving_signatures[N_BEST_SIGNATURE_NAME] = self.translate_n_best
        self.sentencepiece_model = tf.saved_model.Asset(asset_paths[ASSET_FILENAME])
        self.export_info = tf.saved_model.Asset(asset_paths[INFO_FILENAME])


def _tf_variable(variable):
    """The tf.Variable behind a Keras variable (a tf.Variable stays itself)."""
    value = getattr(variable, "value", variable)
    if not isinstance(value, tf.Variable):
        raise TypeError(f"Cannot export {variable!r}: not backed by a tf.Variable (TensorFlow backend needed).")
    return value


# Versions ----------------------------------------------------------------------------


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


def is_export_dir(path):
    """Whether `path` is one exported version (`saved_model.pb` and `assets/export.json`), not a run directory."""
    path = os.fspath(path)
    return os.path.isfile(os.path.join(path, "saved_model.pb")) and os.path.isfile(
        os.path.join(path, "assets", INFO_FILENAME))


def load_export(export_dir, dtype=None):
    """The model and tokenizer inside an exported version: `(Transformer, Tokenizer, export.json as a dict)`.

    An export's graph is traced once and for all: one written by an older
    version decodes with that version's search. This rebuilds the
    `Transformer` that its `export.json` describes, under `dtype` (default
    the precision it was exported in), and loads the weights its variables
    hold, so `export_saved_model(export_dir, ...)` writes the same model with
    this version's graph.

    Raises:
        ValueError: the export's variables are not the described model's
            (another number, name or shape).
    """
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    from keras_transformer.config import TransformerConfig
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.run_dir import build_model

    export_dir = os.fspath(export_dir)
    with open(os.path.join(export_dir, "assets", INFO_FILENAME), encoding="utf-8") as f:
        info = json.load(f)
    model = build_model(TransformerConfig.from_dict(info["model"]), dtype=dtype or info["precision"])
    saved = tf.saved_model.load(export_dir).model_variables

    def relative(name):
        # "transformer_3/encoder/layer_0/.../seed_generator_14/...:0" -> "encoder/layer/.../seed_generator/...":
        # Keras numbers the names it makes unique (the model's, seed generators'), differently in each process.
        return re.sub(r"_\d+(?=/|$)", "", name.split(":")[0].split("/", 1)[-1])

    wanted = [(relative(v.path), tuple(v.shape)) for v in model.variables]
    found = [(relative(v.name), tuple(v.shape)) for v in saved]
    if wanted != found:
        mismatch = next((pair for pair in zip(wanted, found) if pair[0] != pair[1]), (len(wanted), len(found)))
        raise ValueError(f"{export_dir}: its variables are not those of the model its {INFO_FILENAME} describes "
                         f"(first difference: {mismatch[0]} expected, {mismatch[1]} found).")
    for variable, value in zip(model.variables, saved):
        variable.assign(value)
    model.compile()
    return model, Tokenizer(os.path.join(export_dir, "assets", ASSET_FILENAME)), info


def _make_translator(source, options, checkpoint, dtype):
    """The Translator to export: `source` itself or a copy with other decoding `options`, or a run's."""
    from keras_transformer.inference.translator import Translator

    names = ("beam_size", "alpha", "max_extra_length", "max_input_length", "early_stopping")
    if isinstance(source, Translator):
        if dtype not in (None, "auto"):
            raise ValueError("dtype applies to a run directory; a Translator keeps its model's precision.")
        current = {name: getattr(source, name) for name in names}
        changes = {k: v for k, v in options.items() if v is not None and v != current[k]}
        if not changes:
            return source
        # Same model and tokenizer, other decoding options.
        return Translator(source.model, source.tokenizer, **{**current, **changes})
    if isinstance(source, (str, os.PathLike)) and is_export_dir(source):
        if checkpoint is not None:
            raise ValueError("checkpoint applies to a run directory, not to an exported SavedModel.")
        model, tokenizer, info = load_export(source, dtype=dtype)
        recorded = info.get("decoding", {})  # the export's own decoding options, unless changed
        defaults = dict(beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA, max_extra_length=EXTRA_OUTPUT_LENGTH,
                        max_input_length=None, early_stopping=DEFAULT_EARLY_STOPPING)
        return Translator(model, tokenizer, **{k: recorded.get(k, defaults[k]) if options[k] is None else options[k]
                                               for k in names})
    if isinstance(source, (str, os.PathLike)):
        from keras_transformer.run_dir import load_run

        run_dir = os.fspath(source)
        if not os.path.isdir(run_dir):
            raise FileNotFoundError(f"{run_dir}: no such run directory.")
        model, tokenizer = load_run(run_dir, checkpoint=checkpoint, dtype=dtype)
        defaults = dict(beam_size=DEFAULT_BEAM_SIZE, alpha=DEFAULT_ALPHA, max_extra_length=EXTRA_OUTPUT_LENGTH,
                        max_input_length=None, early_stopping=DEFAULT_EARLY_STOPPING)
        return Translator(model, tokenizer, **{k: defaults[k] if options[k] is None else options[k] for k in names})
    raise TypeError(f"source must be a run directory, an exported version or a Translator, "
                    f"got {type(source).__name__}.")


def _export_info(translator, version, source, n_best=None, metadata=None, precision_choice=None):
    import keras_transformer

    config = translator.model.config
    info = {
        "format": "keras_transformer SavedModel for TensorFlow Serving",
        "signature": {
            "name": SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": {"translations": "tf.string [None]", "scores": "float32 [None]"},
        },
        "version": version,
        "source": os.fspath(source) if isinstance(source, (str, os.PathLike)) else None,
        "decoding": {
            "beam_size": translator.beam_size,
            "alpha": translator.alpha,
            "max_extra_length": translator.max_extra_length,
            "max_input_length": translator.max_input_length,
            "early_stopping": translator.early_stopping,
            "max_batch_size": translator.max_batch_size,
            "score": "log P(Y|X) / ((5 + |Y|) / 6) ** alpha, |Y| counting the end token",
        },
        "precision": translator.model.dtype_policy.name,
        # Why: "auto: the CPU has avx512_bf16", or None when chosen by the caller.
        "precision_choice": precision_choice,
        "vocab_size": translator.tokenizer.vocab_size,
        "model": config.to_dict() if hasattr(config, "to_dict") else None,
        "keras_transformer_version": keras_transformer.__version__,
        "tensorflow_version": tf.__version__,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if isinstance(source, (str, os.PathLike)) and is_export_dir(source):
        with open(os.path.join(source, "assets", INFO_FILENAME), encoding="utf-8") as f:
            previous = json.load(f)
        # The same model: how it was trained and scored stays true; the graph is this version's.
        info.update({key: previous[key] for key in ("training", "metadata") if key in previous})
        info["reexported_from"] = {key: previous.get(key) for key in
                                   ("exported_at", "keras_transformer_version", "tensorflow_version", "source")}
    elif isinstance(source, (str, os.PathLike)):
        from keras_transformer.run_dir import CONFIG_FILENAME, read_config

        training = read_config(source).get("training") if os.path.exists(os.path.join(source, CONFIG_FILENAME)) else None
        if training:
            # How the exported model was trained: the run's options as its config.json records them.
            info["training"] = training
    if metadata:
        info["metadata"] = metadata
    if n_best:
        info["n_best_signature"] = {
            "name": N_BEST_SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": {"translations": f"tf.string [None, {n_best}]", "scores": f"float32 [None, {n_best}]"},
        }
    return info


def export_saved_model(source, output_dir, version=None, beam_size=None, alpha=None, max_extra_length=None,
                       *, overwrite=False, max_input_length=None, checkpoint=None, early_stopping=None, dtype=None,
                       n_best=None, metadata=None):
    """Writes a SavedModel for TensorFlow Serving to `output_dir/<version>/`; returns that path.

    Args:
        source: a run directory (loaded with `keras_transformer.run_dir.load_run`),
            an exported version directory (`load_export`: re-exports its
            model with this version's graph, keeping its decoding options,
            training options and metadata unless given), or a `Translator`.
        output_dir: the model's base directory (TF Serving's `--model_base_path`),
            e.g. `saved_models/multi30k_en_de`; created if needed.
        version: integer version; default: highest existing version + 1 (1 for
            a new directory).
        beam_size, alpha, max_extra_length, early_stopping: decoding
            options, fixed in the export and recorded in `export.json`.
            None: 4, 0.6, 50 (§6.1) and "exact" for a run directory, the
            recorded ones for an export, the Translator's own for a Translator.
        overwrite: replace an existing `version` instead of raising.
        max_input_length: longest source in tokens (longer ones are truncated);
            default the model's `config.max_length`.
        checkpoint: for a run directory, export this checkpoint (path or
            "latest") instead of the final `model.keras`.
        dtype: for a run directory or an export, the dtype policy the
            exported graph computes in: "auto" picks "bfloat16" where this
            machine computes it natively (a CPU with AVX512_BF16 / AMX-BF16,
            or Ampere+ GPUs), else "float32"
            (`inference.precision.auto_decoding_precision`). None (default):
            "auto" for a run directory, the precision it was exported in for
            an export. Recorded in `export.json` ("precision",
            and "precision_choice" with the reason for "auto").
        n_best: also export the signature "translate_n_best": inputs
            tf.string [B] -> translations tf.string [B, n_best] and scores
            float32 [B, n_best], best first (n_best at most the beam size).
        metadata: a JSON-serializable dict recorded as `metadata` in the
            export's `assets/export.json` (e.g. the scores and the machine of
            the run it comes from); an export's own is kept otherwise. The training options of a run directory
            (those of its `config.json`: the first run's; a resume's changes
            are in `resumes.jsonl`) are recorded as `training`.

    Returns:
        `output_dir/<version>` (str).

    Raises:
        FileExistsError: `version` exists and `overwrite` is False.
        ValueError: the graph contains Python ops (never expected).
    """
    output_dir = os.fspath(output_dir)
    if version is None:
        version = next_version(output_dir)
    version = int(version)
    if version < 1:
        raise ValueError(f"version must be a positive integer, got {version}.")
    final_dir = os.path.join(output_dir, str(version))
    if tf.io.gfile.exists(final_dir) and not overwrite:
        raise FileExistsError(
            f"{final_dir} already exists; pick another --version, omit it for the next free one "
            f"({next_version(output_dir)}), or pass overwrite=True (--overwrite)."
        )

    options = dict(beam_size=beam_size, alpha=alpha, max_extra_length=max_extra_length,
                   max_input_length=max_input_length, early_stopping=early_stopping)
    precision_choice = None
    if isinstance(source, (str, os.PathLike)):  # "auto" resolved once, for the model and for export.json
        if dtype is None and not is_export_dir(source):
            dtype = "auto"  # a run's default; an export keeps the precision it records
        dtype, precision_choice = resolve_decoding_precision(dtype)
    translator = _make_translator(source, options, checkpoint, dtype)
    if n_best is not None:
        translator.n_best_strings(tf.constant([], tf.string), n_best)  # refuses a bad n_best before writing
    tf.io.gfile.makedirs(output_dir)
    remote = "://" in output_dir
    # Written under a name TF Serving ignores (not an integer), then renamed into place.
    work_dir = final_dir if remote else os.path.join(output_dir, f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="keras_transformer_export_") as assets:
        asset_paths = {ASSET_FILENAME: os.path.join(assets, ASSET_FILENAME),
                       INFO_FILENAME: os.path.join(assets, INFO_FILENAME)}
        with open(asset_paths[ASSET_FILENAME], "wb") as f:
            f.write(translator.tokenizer.model_proto)
        with open(asset_paths[INFO_FILENAME], "w", encoding="utf-8") as f:
            json.dump(_export_info(translator, version, source, n_best, metadata, precision_choice), f, indent=2,
                      sort_keys=True)
        module = _ServingModule(translator, asset_paths, n_best)
        try:
            tf.saved_model.save(
                module,
                work_dir,
                signatures=module.serving_signatures,
            )
            check_serving_ops(work_dir)
        except BaseException:
            if not remote:
                shutil.rmtree(work_dir, ignore_errors=True)
            raise
    if not remote:
        if os.path.exists(final_dir):  # overwrite=True
            shutil.rmtree(final_dir)
        os.rename(work_dir, final_dir)
    logger.info("Exported SavedModel %s in %.1f s", final_dir, time.perf_counter() - start)
    return final_dir
