"""`SavedModelTranslator`: the `Translator`'s `translate` interface over an exported SavedModel.

An export (`keras_transformer.inference.saved_model`) decodes with the options
it was exported with; this class calls its signatures (`signatures`) and
batches sentences as `Translator.translate` does (`batching`), so
`translate --model EXPORT` answers as `translate --model RUN_DIR` with the
same options.
"""

import os

import tensorflow as tf

from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE, DEFAULT_TRANSLATE_WORKERS
from keras_transformer.errors import ParameterError
from keras_transformer.inference.batching import translate_in_batches
from keras_transformer.inference.export_dirs import is_export_dir, read_export_info
from keras_transformer.inference.sentences import count_source_pieces
from keras_transformer.inference.signatures import (
    ALIGNMENT_SIGNATURE_NAME,
    INPUT_NAME,
    N_BEST_SIGNATURE_NAME,
    PREFIX_INPUT_NAME,
    PREFIX_SIGNATURE_NAME,
    SIGNATURE_NAME,
)

_EXPORT_AGAIN = " (export it again with this version of keras-transformer)"


class SavedModelTranslator:
    """The same `translate` interface over an exported SavedModel (`serving_default`).

    Its `max_batch_size`, and the limits `prefixes.overlong_prefixes` reads
    (`max_input_length`, `max_input_bytes`, `max_extra_length`,
    `output_length_cap`), are those the export's `export.json` records (None
    where it records none); its `alignment_layer` the one it aligns with (-1,
    the last, unless it records another).
    """

    def __init__(self, path):
        # The export's graph tokenizes with tensorflow-text's ops, which TensorFlow knows only once
        # tensorflow_text is imported; nothing else may have imported it in this process.
        import tensorflow_text  # noqa: F401

        self.path = resolve_saved_model_dir(path)
        self._loaded = tf.saved_model.load(self.path)
        self._serve = self._loaded.signatures[SIGNATURE_NAME]
        self.max_batch_size = None  # a SavedModel not written by keras-transformer
        self.max_input_length = None
        self.max_input_bytes = None
        self.max_extra_length = None
        self.output_length_cap = None
        self.alignment_layer = -1
        self._tokenizer = None
        if is_export_dir(self.path):
            info = read_export_info(self.path)
            decoding = info.get("decoding", {})
            self.max_batch_size = decoding.get("max_batch_size")
            self.max_input_length = decoding.get("max_input_length")
            self.max_input_bytes = decoding.get("max_input_bytes")
            self.max_extra_length = decoding.get("max_extra_length")
            self.alignment_layer = decoding.get("alignment_layer", -1)
            model = info.get("model") or {}
            if model.get("positional_encoding") == "learned":
                self.output_length_cap = model.get("max_length")

    def source_pieces(self, sentences):
        """The subword count of each sentence, by the export's own vocabulary (`assets/spm.model`)."""
        if self._tokenizer is None:
            from keras_transformer.data.tokenizer import Tokenizer
            from keras_transformer.run_dir import TOKENIZER_FILENAME

            self._tokenizer = Tokenizer(os.path.join(self.path, "assets", TOKENIZER_FILENAME))
        return count_source_pieces(self._tokenizer, sentences)

    def _signature(self, name, parameter, hint=""):
        """The export's signature `name`; a `ParameterError` on `parameter` when the export has none."""
        signature = self._loaded.signatures.get(name)
        if signature is None:
            raise ParameterError(
                parameter, f"cannot be given: {self.path} was exported without a {name} signature{hint}."
            )
        return signature

    def translate_strings(self, inputs):
        return self._serve(inputs=tf.convert_to_tensor(inputs, tf.string))

    def translate_with_prefix(self, inputs, target_prefixes):
        """The export's "translate_with_prefix" signature (`Translator.translate_with_prefix`)."""
        signature = self._signature(PREFIX_SIGNATURE_NAME, "target_prefixes", _EXPORT_AGAIN)
        return signature(
            **{
                INPUT_NAME: tf.convert_to_tensor(inputs, tf.string),
                PREFIX_INPUT_NAME: tf.convert_to_tensor(target_prefixes, tf.string),
            }
        )

    def n_best_strings(self, inputs, n_best, target_prefixes=None):
        """The export's "translate_n_best" signature, cut to `n_best` (at most the exported N); no prefixes."""
        if target_prefixes is not None:
            raise ParameterError(
                "target_prefixes",
                f"cannot be given with n_best: {self.path} has no signature for the n best translations with "
                "prefixes (a run directory has).",
            )
        signature = self._signature(N_BEST_SIGNATURE_NAME, "n_best")
        exported = signature.structured_outputs["translations"].shape[1]
        if not 1 <= n_best <= exported:
            raise ParameterError(
                "n_best", f"must be between 1 and {exported} (the N this SavedModel was exported with), got {n_best}."
            )
        outputs = signature(inputs=tf.convert_to_tensor(inputs, tf.string))
        return {name: value[:, :n_best] for name, value in outputs.items()}

    def aligned_strings(self, inputs, n_best=None, target_prefixes=None):
        """The export's "translate_with_alignments" signature (`Translator.translate_with_alignments`)."""
        for given, parameter, what in (
            (n_best, "n_best", "n best translations"),
            (target_prefixes, "target_prefixes", "prefixes"),
        ):
            if given is not None:
                raise ParameterError(
                    parameter,
                    f"cannot be given with alignments: {self.path} has no signature for the {what} with alignments "
                    "(a run directory has).",
                )
        signature = self._signature(ALIGNMENT_SIGNATURE_NAME, "alignments", _EXPORT_AGAIN)
        return signature(**{INPUT_NAME: tf.convert_to_tensor(inputs, tf.string)})

    def translate(
        self,
        sentences,
        batch_size=DEFAULT_TRANSLATE_BATCH_SIZE,
        progress=False,
        return_scores=False,
        workers=DEFAULT_TRANSLATE_WORKERS,
        n_best=None,
        target_prefixes=None,
        alignments=False,
    ):
        """As `Translator.translate`, through the same batching (`batching.translate_in_batches`)."""
        return translate_in_batches(
            self, sentences, batch_size, progress, return_scores, workers, n_best, target_prefixes, alignments
        )


def resolve_saved_model_dir(path):
    """`path` itself if it holds a SavedModel, else its highest numbered version subdirectory."""
    if tf.io.gfile.exists(os.path.join(path, "saved_model.pb")):
        return path
    versions = [d.rstrip("/") for d in tf.io.gfile.listdir(path) if d.rstrip("/").isdigit()]
    versions = [v for v in versions if tf.io.gfile.exists(os.path.join(path, v, "saved_model.pb"))]
    if not versions:
        raise FileNotFoundError(f"No SavedModel in {path} (no saved_model.pb, no numbered version directory).")
    return os.path.join(path, max(versions, key=int))


def is_saved_model(path):
    try:
        resolve_saved_model_dir(path)
        return True
    except (FileNotFoundError, tf.errors.NotFoundError):
        return False
