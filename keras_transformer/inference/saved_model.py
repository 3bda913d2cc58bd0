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
            assets.extra/tf_serving_warmup_requests
                                  requests TF Serving replays on loading (`serving_warmup`)
            fingerprint.pb
        2/ ...

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
from keras_transformer.inference.export_dirs import (
    INFO_FILENAME,
    is_export_dir,
    list_versions,
    next_version,
    publish_version,
    read_export_info,
    recorded_n_best,
)
from keras_transformer.inference.precision import resolve_decoding_precision
from keras_transformer.inference.serving_warmup import warmup_for_export
from keras_transformer.inference.signatures import INPUT_NAME, N_BEST_SIGNATURE_NAME, OUTPUT_NAMES, SIGNATURE_NAME

logger = logging.getLogger(__name__)

__all__ = [
    "SIGNATURE_NAME",
    "INPUT_NAME",
    "OUTPUT_NAMES",
    "ASSET_FILENAME",
    "export_saved_model",
    "load_export",
    "is_export_dir",
    "read_export_info",
    "next_version",
    "list_versions",
    "saved_model_ops",
    "check_serving_ops",
]

ASSET_FILENAME = "spm.model"

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
            spec = tf.TensorSpec([None], tf.string, name=INPUT_NAME)
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


def _variable_key(name):
    """A variable's name without what Keras makes unique per process: the model's own name (the first part)
    and seed generators' numbers ("transformer_3/encoder/layer_0/.../seed_generator_14/...:0" ->
    "encoder/layer_0/.../seed_generator/...")."""
    return re.sub(r"seed_generator_\d+", "seed_generator", name.split(":")[0].split("/", 1)[-1])


def load_export(export_dir, dtype=None):
    """The model and tokenizer inside an exported version: `(Transformer, Tokenizer, export.json as a dict)`.

    An export's graph is traced once and for all: one written by an older
    version decodes with that version's search. This rebuilds the
    `Transformer` that its `export.json` describes, under `dtype` (default
    the precision it was exported in), and loads the weights its variables
    hold, so `export_saved_model(export_dir, ...)` writes the same model with
    this version's graph. (The weights are those the export stores: a
    bfloat16 export's are bfloat16 values, whatever `dtype`.)

    Raises:
        ValueError: the export records no model, or its variables are not
            the described model's (another number, name or shape).
    """
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    from keras_transformer.config import TransformerConfig
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.run_dir import build_model

    export_dir = os.fspath(export_dir)
    info = read_export_info(export_dir)
    if not info.get("model"):
        raise ValueError(f"{export_dir}: its {INFO_FILENAME} records no model configuration to rebuild.")
    model = build_model(TransformerConfig.from_dict(info["model"]), dtype=dtype or info["precision"])
    saved = tf.saved_model.load(export_dir).model_variables
    pairs = list(zip(model.variables, saved))
    differing = next(
        (
            index
            for index, (variable, value) in enumerate(pairs)
            if (_variable_key(variable.path), tuple(variable.shape)) != (_variable_key(value.name), tuple(value.shape))
        ),
        None,
    )
    problem = None
    if len(saved) != len(model.variables):
        problem = f"the model has {len(model.variables)} variables, the export {len(saved)}"
    elif differing is not None:
        variable, value = pairs[differing]
        problem = (
            f"variable {differing} is {value.name} {tuple(value.shape)} in the export, "
            f"{variable.path} {tuple(variable.shape)} in the model"
        )
    if problem:
        raise ValueError(
            f"{export_dir}: its variables are not those of the model its {INFO_FILENAME} describes: {problem}."
        )
    for variable, value in pairs:
        variable.assign(value)
    model.compile()
    return model, Tokenizer(os.path.join(export_dir, "assets", ASSET_FILENAME)), info


# Decoding options of a run directory's export unless given (§6.1).
_RUN_DECODING_DEFAULTS = dict(
    beam_size=DEFAULT_BEAM_SIZE,
    alpha=DEFAULT_ALPHA,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    max_input_length=None,
    early_stopping=DEFAULT_EARLY_STOPPING,
)


def _make_translator(source, options, checkpoint, dtype, previous=None):
    """The Translator to export: `source` itself or a copy with other decoding `options`, a run's, or an export's
    (`previous`: its `export.json`; with the decoding options it records, unless given)."""
    from keras_transformer.inference.translator import Translator

    names = tuple(_RUN_DECODING_DEFAULTS)
    if isinstance(source, Translator):
        if dtype not in (None, "auto"):
            raise ValueError("dtype applies to a run directory; a Translator keeps its model's precision.")
        current = {name: getattr(source, name) for name in names}
        changes = {k: v for k, v in options.items() if v is not None and v != current[k]}
        if not changes:
            return source
        # Same model, tokenizer and request limit (and sampling, if it samples), other decoding options.
        return Translator(
            source.model,
            source.tokenizer,
            **{**current, **changes},
            max_batch_size=source.max_batch_size,
            sampling=source.sampling,
            jit_compile=source._jit_compile,
        )
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"source must be a run directory, an exported version or a Translator, got {type(source).__name__}."
        )
    path, limits = os.fspath(source), {}
    if previous is not None:
        if checkpoint is not None:
            raise ValueError("checkpoint applies to a run directory, not to an exported SavedModel.")
        model, tokenizer, _ = load_export(path, dtype=dtype)
        recorded = previous.get("decoding", {})
        defaults = {**_RUN_DECODING_DEFAULTS, **{k: v for k, v in recorded.items() if k in names}}
        if recorded.get("max_batch_size"):  # the limit its clients know
            limits = dict(max_batch_size=recorded["max_batch_size"])
    else:
        from keras_transformer.run_dir import CONFIG_FILENAME, load_run

        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: no such run directory.")
        if not os.path.exists(os.path.join(path, CONFIG_FILENAME)):
            if os.path.exists(os.path.join(path, "saved_model.pb")):
                raise ValueError(
                    f"{path}: a SavedModel without assets/{INFO_FILENAME}; only exports written by "
                    f"keras-transformer can be exported again."
                )
            if list_versions(path):
                raise ValueError(
                    f"{path} holds exported versions; give one, e.g. "
                    f"{os.path.join(path, str(list_versions(path)[-1]))}."
                )
        model, tokenizer = load_run(path, checkpoint=checkpoint, dtype=dtype)
        defaults = _RUN_DECODING_DEFAULTS
    return Translator(
        model, tokenizer, **limits, **{k: defaults[k] if options[k] is None else options[k] for k in names}
    )


def _export_info(
    translator, version, source, n_best=None, metadata=None, precision_choice=None, previous=None, weights=None
):
    """`export.json`'s content; `previous`: the `export.json` of the export `source` is, if it is one;
    `weights`: the file of a run directory the weights come from (`run_dir.weights_file`)."""
    import keras_transformer

    config = translator.model.config
    info = {
        "format": "keras_transformer SavedModel for TensorFlow Serving",
        "signature": {
            "name": SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, ("tf.string [None]", "float32 [None]"))),
        },
        "version": version,
        "source": os.fspath(source) if isinstance(source, (str, os.PathLike)) else None,
        "weights": weights,
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
    if translator.sampling:
        info["decoding"]["sampling"] = translator.sampling
    if previous is not None:
        info["weights"] = previous.get("weights")
        # The same model: how it was trained stays true, and its recorded scores while it decodes as it did.
        same_answers = info["decoding"] == previous.get("decoding") and info["precision"] == previous.get("precision")
        kept = ("training", "metadata") if same_answers else ("training",)
        info.update({key: previous[key] for key in kept if key in previous})
        info["reexported_from"] = {
            key: previous.get(key)
            for key in ("exported_at", "keras_transformer_version", "tensorflow_version", "source", "reexported_from")
        }
        if not same_answers:  # other options or precision: the old scores describe the old export only
            info["reexported_from"].update(
                decoding=previous.get("decoding"),
                precision=previous.get("precision"),
                metadata=previous.get("metadata"),
            )
    elif isinstance(source, (str, os.PathLike)):
        from keras_transformer.run_dir import CONFIG_FILENAME, read_config

        training = (
            read_config(source).get("training") if os.path.exists(os.path.join(source, CONFIG_FILENAME)) else None
        )
        if training:
            # How the exported model was trained: the run's options as its config.json records them.
            info["training"] = training
    if metadata:
        info["metadata"] = metadata
    if n_best:
        info["n_best_signature"] = {
            "name": N_BEST_SIGNATURE_NAME,
            "n_best": n_best,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, (f"tf.string [None, {n_best}]", f"float32 [None, {n_best}]"))),
        }
    return info


def _n_best_to_export(n_best, recorded, translator, source):
    """The N of the "translate_n_best" signature to write, or None for none (`n_best` 0 or None, nothing recorded).

    An export's own N (`recorded`) holds unless `n_best` is given; one that a
    smaller new beam cannot give is refused with where it came from.
    """
    if n_best is None and recorded is not None:
        if recorded > translator.beam_size:
            raise ValueError(
                f"{source} has a translate_n_best signature of the {recorded} best, more than the beam "
                f"size {translator.beam_size} gives; pass n_best (--n-best) of at most "
                f"{translator.beam_size}, or 0 for no n-best signature."
            )
        n_best = recorded
    if n_best is None or (n_best == 0 and not isinstance(n_best, bool)):
        return None
    translator.n_best_strings(tf.constant([], tf.string), n_best)  # refuses a bad n_best before writing
    return n_best


def export_saved_model(
    source,
    output_dir,
    version=None,
    beam_size=None,
    alpha=None,
    max_extra_length=None,
    *,
    overwrite=False,
    max_input_length=None,
    checkpoint=None,
    early_stopping=None,
    dtype=None,
    n_best=None,
    metadata=None,
    warmup_sentences="auto",
):
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
            default the model's `config.max_length` (an export's recorded one).
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
            An export's own N unless given; 0: no such signature.
        metadata: a JSON-serializable dict recorded as `metadata` in the
            export's `assets/export.json` (e.g. the scores and the machine of
            the run it comes from). The training options of a run directory
            (those of its `config.json`: the first run's; a resume's changes
            are in `resumes.jsonl`) are recorded as `training`. An export's
            training options are kept, and its metadata too unless given or
            unless the decoding options or precision change (its scores
            would no longer hold): then it moves to `reexported_from`.
        warmup_sentences: source sentences for the requests TensorFlow
            Serving replays when it loads the version
            (`assets.extra/tf_serving_warmup_requests`, see
            `serving_warmup`), so that its first client request does not
            wait for TensorFlow's first-run work. "auto" (default): an
            export's own, else the first validation sources of a run
            directory's data where they can be read, else none; None: none.

    Returns:
        `output_dir/<version>` (str).

    Raises:
        FileExistsError: `version` exists (or appears while the export
            runs) and `overwrite` is False.
        FileNotFoundError: `source` is no directory.
        ValueError: the graph contains Python ops (never expected); an
            export's variables do not match its model (`load_export`); a
            checkpoint given with an export; a SavedModel not written by
            this package, or a base directory of versions, as `source`.
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

    options = dict(
        beam_size=beam_size,
        alpha=alpha,
        max_extra_length=max_extra_length,
        max_input_length=max_input_length,
        early_stopping=early_stopping,
    )
    precision_choice, previous, inherited_n_best = None, None, None
    if isinstance(source, (str, os.PathLike)):  # "auto" resolved once, for the model and for export.json
        previous = read_export_info(source) if is_export_dir(source) else None
        if previous is None and dtype is None:
            dtype = "auto"  # a run's default; an export keeps the precision it records ...
        dtype, precision_choice = resolve_decoding_precision(dtype)
        if previous is not None:
            precision_choice = precision_choice if dtype else previous.get("precision_choice")  # ... and why
            inherited_n_best = recorded_n_best(previous)
    write_warmup = warmup_for_export(warmup_sentences, source)  # bad sentences are refused before the slow part
    translator = _make_translator(source, options, checkpoint, dtype, previous)
    n_best = _n_best_to_export(n_best, inherited_n_best, translator, source)
    weights = None
    if isinstance(source, (str, os.PathLike)) and previous is None:
        from keras_transformer.run_dir import weights_file

        weights = weights_file(os.fspath(source), checkpoint)
    tf.io.gfile.makedirs(output_dir)
    # Written under a name TF Serving ignores (not an integer), then moved into place (`publish_version`).
    work_dir = os.path.join(output_dir, f".tmp-{version}-{uuid.uuid4().hex[:8]}")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="keras_transformer_export_") as assets:
        asset_paths = {
            ASSET_FILENAME: os.path.join(assets, ASSET_FILENAME),
            INFO_FILENAME: os.path.join(assets, INFO_FILENAME),
        }
        with open(asset_paths[ASSET_FILENAME], "wb") as f:
            f.write(translator.tokenizer.model_proto)
        with open(asset_paths[INFO_FILENAME], "w", encoding="utf-8") as f:
            json.dump(
                _export_info(translator, version, source, n_best, metadata, precision_choice, previous, weights),
                f,
                indent=2,
                sort_keys=True,
            )
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
