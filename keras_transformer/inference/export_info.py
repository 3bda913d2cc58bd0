"""What an export's `assets/export.json` records: its signatures, decoding options, precision and model.

`saved_model` writes it beside each exported version, for reference and for
`SavedModelTranslator`, the re-export and the command line to read back
(`export_dirs.read_export_info`).
"""

import time

import tensorflow as tf

from keras_transformer.decoding.defaults import DEFAULT_LENGTH_PENALTY, SCORE_FORMULAS
from keras_transformer.inference.signatures import (
    ALIGNMENT_OUTPUT_NAME,
    ALIGNMENT_SIGNATURE_NAME,
    INPUT_NAME,
    N_BEST_SIGNATURE_NAME,
    OUTPUT_NAMES,
    PREFIX_INPUT_NAME,
    PREFIX_SIGNATURE_NAME,
    SIGNATURE_NAME,
)


def export_info(translator, version, n_best, precision_choice):
    """`export.json`'s content that the translator alone tells; `source` and `weights` None until the caller's
    source sets them."""
    import keras_transformer

    config = translator.model.config
    info = {
        "format": "keras_transformer SavedModel for TensorFlow Serving",
        "signature": {
            "name": SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, ("tf.string [None]", "float32 [None]"))),
        },
        "prefix_signature": {
            "name": PREFIX_SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]", PREFIX_INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, ("tf.string [None]", "float32 [None]"))),
        },
        "alignment_signature": {
            "name": ALIGNMENT_SIGNATURE_NAME,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(
                zip((*OUTPUT_NAMES, ALIGNMENT_OUTPUT_NAME), ("tf.string [None]", "float32 [None]", "tf.string [None]"))
            ),
            "alignment_layer": translator.alignment_layer,
        },
        "version": version,
        "source": None,
        "weights": None,
        "decoding": {
            "beam_size": translator.beam_size,
            "alpha": translator.alpha,
            "max_extra_length": translator.max_extra_length,
            "max_input_length": translator.max_input_length,
            "max_input_bytes": translator.max_input_bytes,
            "early_stopping": translator.early_stopping,
            "max_batch_size": translator.max_batch_size,
            "score": SCORE_FORMULAS[translator.length_penalty],
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
    if translator.no_repeat_ngram_size:  # recorded when on: an export without it decodes as before it existed
        info["decoding"]["no_repeat_ngram_size"] = translator.no_repeat_ngram_size
    if translator.length_penalty != DEFAULT_LENGTH_PENALTY:  # recorded when not GNMT's, as the two above
        info["decoding"]["length_penalty"] = translator.length_penalty
    if translator.alignment_layer != -1:  # recorded when not the last layer, as no_repeat_ngram_size when on
        info["decoding"]["alignment_layer"] = translator.alignment_layer
    if n_best:
        info["n_best_signature"] = {
            "name": N_BEST_SIGNATURE_NAME,
            "n_best": n_best,
            "inputs": {INPUT_NAME: "tf.string [None]"},
            "outputs": dict(zip(OUTPUT_NAMES, (f"tf.string [None, {n_best}]", f"float32 [None, {n_best}]"))),
        }
    return info


def inherit_info(info, previous):
    """Takes into a re-export's `info` what still holds of the `export.json` it comes from (`previous`)."""
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
