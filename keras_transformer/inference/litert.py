"""A translator as one LiteRT (TFLite) file: sentences in, translations out, without TensorFlow's runtime.

`export_litert` writes one `.tflite` flatbuffer holding the whole
translator, as the SavedModel does (`inference.saved_model`): tokenization,
the encoder, the cached decoder and the search (§6.1) in one `while_loop`,
with the decoding options fixed when it is written. Its signatures:

    "serving_default"  inputs tf.string [None] -> translations tf.string [None], scores float32 [None]
                       (the SavedModel's: a score is log P / lp(|Y|); "" and 0 for a blank input)
    "source_pieces"    inputs tf.string [None] -> pieces int32 [None] (subwords of each, before truncation)

and beside it `<name>.json` records what `assets/export.json` records for
a SavedModel (decoding options, model, versions), plus the file's ops and size.

What LiteRT runs differently, and why:

- the text: LiteRT has none of TensorFlow's string ops, and tensorflow-text's
  LiteRT tokenizer (`FastSentencepieceTokenizer`) segments as a unigram
  model, not by BPE merges (1,995 of 2,000 Multi30k lines get other pieces);
  so the file splits a sentence into bytes and normalizes and merges on
  numbers (`litert_text`), giving the `Translator`'s ids;
- the search: it is the form XLA compiles (traced under `jit_compile`, not
  compiled): a preallocated cache written in place, a batch that keeps its
  sentences to the end. The plain graph's encoder chunks (a `TensorArray` of
  dynamic element shape) and growing cache do not convert to builtins;
- slices that insert axes into tensors of two dynamic dimensions, or start
  with an ellipsis, are rewritten as reshapes (`litert_graph.expand_new_axes`);
- an empty batch: some LiteRT kernels fail on tensors without elements, so
  the text functions carry a blank sentence after the last, which an empty
  batch searches alone (no `tf.cond`: the weights would reach its branches
  as inputs, and the quantizer would leave them in float32);
- the request limit: the SavedModel's assertion has no LiteRT op, so
  `LiteRTTranslator` checks `max_batch_size` before it runs the file.

The file needs LiteRT's builtin ops and tensorflow-text's `ByteSplitWithOffsets`
and `NgramsStringJoin` only (`export_litert` refuses anything else).
"""

from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from keras_transformer.decoding.defaults import DEFAULT_LENGTH_PENALTY, SCORE_FORMULAS
from keras_transformer.errors import ParameterError
from keras_transformer.inference.signatures import INPUT_NAME, OUTPUT_NAMES, SIGNATURE_NAME

SUFFIX = ".tflite"
PIECES_SIGNATURE_NAME = "source_pieces"
QUANTIZATIONS = ("int8",)
RUNTIMES = ("tensorflow", "ai_edge_litert")
# As the SavedModel's (`translator.MAX_BATCH_SIZE`), for a file without its JSON.
DEFAULT_MAX_BATCH_SIZE = 1024


def info_path(path):
    """The JSON written beside a LiteRT file: `model.tflite` -> `model.json`."""
    path = os.fspath(path)
    return (path[: -len(SUFFIX)] if path.endswith(SUFFIX) else path) + ".json"


def is_litert_file(path):
    """Whether `path` is a `.tflite` file."""
    path = os.fspath(path)
    return path.endswith(SUFFIX) and os.path.isfile(path)


# Export ---------------------------------------------------------------------------------


def export_litert(
    source,
    output_path,
    decoding=None,
    *,
    checkpoint=None,
    precision="float32",
    quantize=None,
    overwrite=False,
    metadata=None,
):
    """Writes the translator of a run, an exported SavedModel or a `Translator` as one LiteRT file.

    Args:
        source: a training run directory, an exported SavedModel version
            (`saved_models/NAME/1`) or a `Translator`.
        output_path: the `.tflite` file to write; `<name>.json` is written beside it.
        decoding: `DecodingOptions` to fix in the file; those not given are the
            source's own (§6.1's for a run, the recorded ones for an export).
        checkpoint: for a run, a checkpoint (path or "latest") instead of the final model.
        precision: "float32" (or "auto", or None: the same): LiteRT has no
            bfloat16 kernels, so the file computes in float32 whatever the
            model was trained or exported in.
        quantize: None (float32 weights) or "int8": dynamic-range quantization
            (int8 weights, float activations), about a quarter of the size.
        overwrite: replace an existing file.
        metadata: a JSON-serializable dict recorded as `metadata` in the JSON.

    Returns:
        `output_path` (str).

    Raises:
        FileExistsError: `output_path` exists and `overwrite` is False.
        ValueError: a source the LiteRT file cannot hold (sampling, a tokenizer
            other than `train_tokenizer`'s), or a conversion that would need
            ops LiteRT lacks.
    """
    output_path = os.fspath(output_path)
    if not output_path.endswith(SUFFIX):
        raise ParameterError("output_path", f"must end with {SUFFIX}, got {output_path!r}.")
    if precision not in (None, "auto", "float32"):
        raise ParameterError(
            "precision",
            f"must be float32 for a LiteRT file (LiteRT has no {precision} kernels; quantize='int8' makes it "
            "smaller), got " + repr(precision) + ".",
        )
    if quantize is not None and quantize not in QUANTIZATIONS:
        raise ParameterError("quantize", f"must be None or one of {', '.join(QUANTIZATIONS)}, got {quantize!r}.")
    for path in (output_path, info_path(output_path)):
        if os.path.exists(path) and not overwrite:
            raise FileExistsError(f"{path} exists; pass overwrite=True (--overwrite) to replace it.")
    translator, source_info = _translator_of(source, decoding, checkpoint)
    start = time.perf_counter()
    flatbuffer = convert_translator(translator, quantize)
    info = _export_info(translator, flatbuffer, quantize)
    info.update(source_info, file=os.path.basename(output_path), convert_seconds=round(time.perf_counter() - start, 1))
    if metadata:
        info["metadata"] = metadata
    _write_atomically(output_path, flatbuffer)
    _write_atomically(info_path(output_path), json.dumps(info, indent=2, sort_keys=True).encode())
    return output_path


def convert_translator(translator, quantize=None):
    """The LiteRT flatbuffer (bytes) of a `Translator`: its model, tokenizer and decoding options."""
    import tensorflow as tf

    from keras_transformer.inference import litert_graph, litert_text
    from keras_transformer.inference.litert_vocab import SubwordTables

    if translator.sampling:
        raise ValueError("A LiteRT translator searches (beam or greedy); sampling has no LiteRT form.")
    if translator.model.compute_dtype != "float32":
        raise ValueError(
            f"A LiteRT translator computes in float32 (LiteRT has no {translator.model.compute_dtype} kernels); "
            "load the model in float32, and quantize='int8' for smaller weights."
        )
    tables = SubwordTables.from_proto(translator.tokenizer.model_proto)
    spec = tf.TensorSpec([None], tf.string, name=INPUT_NAME)
    # Traced in an XLA context (never compiled): the search takes its static-shape form.
    translate = tf.function(
        lambda inputs: _translate_graph(translator, tables, inputs),
        input_signature=[spec],
        jit_compile=True,
        autograph=False,
    )
    count = tf.function(
        lambda inputs: {"pieces": litert_text.row_lengths(litert_text.pieces(inputs, tables)[0])[: tf.size(inputs)]},
        input_signature=[spec],
        autograph=False,
    )
    functions = {
        SIGNATURE_NAME: translate.get_concrete_function(),
        PIECES_SIGNATURE_NAME: count.get_concrete_function(),
    }
    return litert_graph.convert(functions, quantize)


def _translate_graph(translator, tables, inputs):
    """The file's "serving_default": `Translator.translate_strings` with the tokenizer of `litert_text`.

    The text functions add a blank sentence after the last (`litert_text.byte_grid`); only an empty batch
    searches it (there is no `tf.cond` around the search: LiteRT passes the weights into a conditional's
    branches as inputs, which its quantizer then takes for activations), and it is dropped from the outputs.
    """
    import tensorflow as tf

    from keras_transformer import decoding
    from keras_transformer.inference import litert_text
    from keras_transformer.special_ids import PAD_ID

    count = tf.size(inputs)
    rows = tf.maximum(count, 1)
    max_input_bytes = getattr(translator, "max_input_bytes", None)
    source_ids, blank = litert_text.source_ids(inputs, tables, translator.max_input_length, max_input_bytes)
    source_ids, blank = source_ids[:rows], blank[:rows]
    # n-gram blocking where the translator (and so the search) has it.
    blocking = getattr(translator, "no_repeat_ngram_size", 0)
    options = dict(
        max_extra_length=translator.max_extra_length, **({"no_repeat_ngram_size": blocking} if blocking else {})
    )
    if translator.beam_size == 1:
        token_ids, scores = decoding.greedy_search(translator.model, source_ids, **options)
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(token_ids, PAD_ID), tf.int32), axis=-1)
        scores = scores / decoding.length_penalty(lengths, translator.alpha, translator.length_penalty)
    else:
        token_ids, scores = decoding.beam_search(
            translator.model,
            source_ids,
            beam_size=translator.beam_size,
            alpha=translator.alpha,
            early_stopping=translator.early_stopping,
            length_penalty=translator.length_penalty,
            **options,
        )
    # A blank sentence decodes no token: "" (LiteRT has no select over strings).
    token_ids = tf.where(blank[:, None], PAD_ID, token_ids)
    texts = litert_text.detokenize(token_ids, tables, _max_output_length(translator))
    # Gathered, not sliced: a slice of strings is a version of LiteRT's slice that its reference kernels lack.
    return {"translations": tf.gather(texts, tf.range(count)), "scores": tf.where(blank, 0.0, scores)[:count]}


def _max_output_length(translator):
    """The most tokens the search writes for a source (`decoding.tokens.output_limits`' buffer length)."""
    config = translator.model.config
    length = translator.max_input_length + translator.max_extra_length
    return min(length, config.max_length) if config.positional_encoding == "learned" else length


def _translator_of(source, decoding, checkpoint):
    """`(Translator, {"source": ..., "weights": ..., "training": ...})` of a run, an export or a `Translator`."""
    from keras_transformer.inference.export_dirs import is_export_dir, read_export_info
    from keras_transformer.inference.export_sources import (
        run_training_options,
        translator_of_export,
        translator_of_run,
        with_decoding,
    )
    from keras_transformer.inference.translator import Translator
    from keras_transformer.run_dir import weights_file

    if isinstance(source, Translator):
        return with_decoding(source, decoding), {"source": None, "weights": None}
    path = os.fspath(source)
    if is_export_dir(path):
        previous = read_export_info(path)
        info = {"source": path, "weights": previous.get("weights")}
        info.update({key: previous[key] for key in ("training", "metadata") if key in previous})
        return translator_of_export(path, decoding, "float32"), info
    translator = translator_of_run(path, decoding, checkpoint, "float32")
    info = {"source": path, "weights": weights_file(path, checkpoint)}
    training = run_training_options(path)
    if training:
        info["training"] = training
    return translator, info


def _export_info(translator, flatbuffer, quantize):
    """The JSON's content that the translator and the file tell."""
    import tensorflow as tf

    import keras_transformer
    from keras_transformer.inference.litert_graph import operator_counts

    config = translator.model.config
    return {
        "format": "keras_transformer LiteRT translator",
        "signature": {
            "name": SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, ("tf.string [None]", "float32 [None]"))),
        },
        "pieces_signature": {
            "name": PIECES_SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": {"pieces": "int32 [None]"},
        },
        "decoding": {
            "beam_size": translator.beam_size,
            "alpha": translator.alpha,
            "max_extra_length": translator.max_extra_length,
            "max_input_length": translator.max_input_length,
            "early_stopping": translator.early_stopping,
            "max_batch_size": translator.max_batch_size,
            **{
                name: getattr(translator, name)
                for name in ("no_repeat_ngram_size", "max_input_bytes")
                if getattr(translator, name, None)
            },
            **(
                {"length_penalty": translator.length_penalty}
                if translator.length_penalty != DEFAULT_LENGTH_PENALTY
                else {}
            ),
            "score": SCORE_FORMULAS[translator.length_penalty],
        },
        "precision": "float32",
        "quantization": "int8 dynamic range (int8 weights, float32 activations)" if quantize else None,
        "vocab_size": translator.tokenizer.vocab_size,
        "model": config.to_dict() if hasattr(config, "to_dict") else None,
        "operators": operator_counts(flatbuffer),
        "size_bytes": len(flatbuffer),
        "keras_transformer_version": keras_transformer.__version__,
        "tensorflow_version": tf.__version__,
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _write_atomically(path, data):
    """Writes `data` to `path` through a temporary file in its directory, renamed when complete."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    work_path = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(work_path, "wb") as f:
            f.write(data)
        os.replace(work_path, path)
    finally:
        if os.path.exists(work_path):
            os.remove(work_path)


# Translating ----------------------------------------------------------------------------


class LiteRTTranslator:
    """The `translate` interface of `SavedModelTranslator` over a LiteRT file, run by a LiteRT interpreter.

    Loads neither Keras nor the model's code: only the interpreter and
    tensorflow-text's LiteRT kernels (registered from their extension module).

    Args:
        path: the `.tflite` file; its `<name>.json`, if present, gives the request limit and input length.
        num_threads: the interpreter's threads (each batch in flight has its own interpreter); None: its default.
        reference_kernels: run LiteRT's reference kernels (no XNNPACK, no CPU-specific code paths).
        runtime: "tensorflow" (`tf.lite`'s interpreter) or "ai_edge_litert" (the `ai-edge-litert` package's).

    Attributes:
        max_batch_size: the most sentences one call takes (the SavedModel's limit).
        max_input_length: the longest source in subwords, end token included, or None.
        max_input_bytes: the bytes of a sentence the file reads (it cuts the rest), or None.
        info: the JSON written beside the file ({} without one).
    """

    def __init__(self, path, num_threads=None, reference_kernels=False, runtime="tensorflow"):
        if runtime not in RUNTIMES:
            raise ParameterError("runtime", f"must be one of {', '.join(RUNTIMES)}, got {runtime!r}.")
        self.path = os.fspath(path)
        if not os.path.isfile(self.path):
            raise FileNotFoundError(f"{self.path}: no such LiteRT file.")
        self.info = {}
        if os.path.exists(info_path(self.path)):
            with open(info_path(self.path), encoding="utf-8") as f:
                self.info = json.load(f)
        decoding = self.info.get("decoding", {})
        self.max_batch_size = decoding.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE
        self.max_input_length = decoding.get("max_input_length")
        self.max_input_bytes = decoding.get("max_input_bytes")
        self._options = dict(num_threads=num_threads, reference_kernels=reference_kernels, runtime=runtime)
        self._local = threading.local()  # an interpreter is not thread-safe: one per thread
        self._runner(SIGNATURE_NAME)  # fails now, not at the first sentence, on a file it cannot run

    def _runner(self, signature):
        runners = getattr(self._local, "runners", None)
        if runners is None:
            interpreter = make_interpreter(self.path, **self._options)
            runners = self._local.runners = {
                name: interpreter.get_signature_runner(name) for name in (SIGNATURE_NAME, PIECES_SIGNATURE_NAME)
            }
        return runners[signature]

    def _run(self, signature, inputs):
        sentences = _sentences_array(inputs)
        if sentences.shape[0] > self.max_batch_size:
            raise ValueError(
                f"keras_transformer: at most {self.max_batch_size} sentences per request (inputs [N], N <= "
                f"{self.max_batch_size}); split the batch"
            )
        return self._runner(signature)(**{INPUT_NAME: sentences})

    def translate_strings(self, inputs):
        """tf.string `[N]` (or a list of str/bytes) -> `{"translations": tf.string [N], "scores": float32 [N]}`."""
        import tensorflow as tf

        out = self._run(SIGNATURE_NAME, inputs)
        return {name: tf.constant(out[name]) for name in OUTPUT_NAMES}

    def source_pieces(self, sentences):
        """The subword count of each sentence (a list of str), from the file's "source_pieces" signature."""
        if not sentences:
            return np.zeros([0], np.int64)
        return self._run(PIECES_SIGNATURE_NAME, sentences)["pieces"].astype(np.int64)

    def n_best_strings(self, inputs, n_best):
        raise ParameterError(
            "n_best", f"cannot be given: {self.path} is a LiteRT translator, which has no n-best lists."
        )

    def translate(
        self,
        sentences,
        batch_size=None,
        progress=False,
        return_scores=False,
        workers=None,
        n_best=None,
        alignments=False,
    ):
        """As `Translator.translate`, through the same batching (`batching.translate_in_batches`); no `alignments`."""
        from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE, DEFAULT_TRANSLATE_WORKERS
        from keras_transformer.inference.batching import translate_in_batches

        batch_size = min(batch_size or DEFAULT_TRANSLATE_BATCH_SIZE, self.max_batch_size)
        workers = workers or DEFAULT_TRANSLATE_WORKERS
        return translate_in_batches(
            self, sentences, batch_size, progress, return_scores, workers, n_best, alignments=alignments
        )


def make_interpreter(path, num_threads=None, reference_kernels=False, runtime="tensorflow"):
    """A LiteRT interpreter for the file `path` with tensorflow-text's ops registered."""
    from keras_transformer import compat

    registerers = compat.tflite_text_op_registerers()
    if runtime == "ai_edge_litert":
        from ai_edge_litert import interpreter as litert

        resolver = litert.OpResolverType.BUILTIN_REF if reference_kernels else litert.OpResolverType.AUTO
        return litert.InterpreterWithCustomOps(
            model_path=path,
            custom_op_registerers=registerers,
            experimental_op_resolver_type=resolver,
            num_threads=num_threads,
        )
    import tensorflow as tf

    resolver = tf.lite.experimental.OpResolverType.BUILTIN_REF if reference_kernels else None
    return compat.tflite_interpreter_with_custom_ops(path, registerers, resolver, num_threads)


def _sentences_array(inputs):
    """Sentences (a tf.string tensor, an array, a list of str or bytes) -> a NumPy array of bytes `[N]`."""
    if hasattr(inputs, "numpy"):
        inputs = inputs.numpy()
    values = [
        s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in np.asarray(inputs, dtype=object).reshape(-1)
    ]
    array = np.empty([len(values)], dtype=object)
    array[:] = values
    return array


def load_litert_translator(path, options_given=False, sampling=None, **interpreter_options):
    """`LiteRTTranslator(path)` for `load_translator`: the file decodes as exported (options given are ignored).

    Raises:
        ValueError: `sampling` is given (the file searches).
    """
    import logging

    if sampling:
        raise ValueError(
            f"{path} is a LiteRT translator, which decodes as exported (beam search): sampling needs the "
            "training run directory."
        )
    if options_given:
        logging.getLogger(__name__).warning(
            "%s is a LiteRT translator: decoding options were fixed at export; ignoring the ones given.", path
        )
    return LiteRTTranslator(path, **interpreter_options)
