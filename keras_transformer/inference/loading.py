"""`load_translator`: the translator for a path, whatever it holds (a run, a SavedModel, a LiteRT file).

Its own module, above the three kinds of translator (`translator`,
`saved_model_translator`, `litert`), so that none of them imports another
to be found by path.
"""

import logging
import os

from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    DEFAULT_LENGTH_PENALTY,
    EXTRA_OUTPUT_LENGTH,
)
from keras_transformer.errors import ParameterError
from keras_transformer.inference import litert
from keras_transformer.inference.saved_model_translator import SavedModelTranslator, is_saved_model
from keras_transformer.inference.translator import Translator

logger = logging.getLogger(__name__)


def load_translator(
    path,
    beam_size=DEFAULT_BEAM_SIZE,
    alpha=DEFAULT_ALPHA,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    early_stopping=DEFAULT_EARLY_STOPPING,
    precision=None,
    checkpoint=None,
    sampling=None,
    no_repeat_ngram_size=0,
    alignment_layer=None,
    length_penalty=DEFAULT_LENGTH_PENALTY,
):
    """A translator for a run directory, an exported SavedModel or a LiteRT file (options fixed at export).

    `sampling`: `dict(top_k=..., temperature=..., seed=...)` to sample instead of searching (run directories).
    `no_repeat_ngram_size`, `length_penalty`: see `Translator`. `alignment_layer`: see `Translator` (None: the
    last layer, or the one a SavedModel was exported with).

    Raises:
        ParameterError: ("alignment_layer") a layer the model has not, one other than a SavedModel's, or any for
            a LiteRT file (which gives no alignments).
    """
    given = (beam_size, alpha, max_extra_length, early_stopping, precision, checkpoint, no_repeat_ngram_size)
    given = given != (DEFAULT_BEAM_SIZE, DEFAULT_ALPHA, EXTRA_OUTPUT_LENGTH, DEFAULT_EARLY_STOPPING, None, None, 0)
    given = given or length_penalty != DEFAULT_LENGTH_PENALTY
    if litert.is_litert_file(path):
        if alignment_layer is not None:
            raise ParameterError(
                "alignment_layer", f"cannot be given: {path} is a LiteRT file, which gives no alignments."
            )
        return litert.load_litert_translator(path, options_given=given, sampling=sampling)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory (expected a run directory or a SavedModel).")
    if is_saved_model(path):
        if sampling:
            raise ValueError(
                f"{path} is a SavedModel, which decodes as exported (beam search): sampling needs the "
                "training run directory."
            )
        if given:
            logger.warning("%s is a SavedModel: decoding options were fixed at export; ignoring the ones given.", path)
        translator = SavedModelTranslator(path)
        if alignment_layer is not None and alignment_layer != translator.alignment_layer:
            raise ParameterError(
                "alignment_layer",
                f"must be {translator.alignment_layer} for {path}, the layer it was exported with (export it again "
                f"with alignment_layer {alignment_layer} to align with that one).",
            )
        return translator
    return Translator.from_run_dir(
        path,
        beam_size=beam_size,
        alpha=alpha,
        max_extra_length=max_extra_length,
        early_stopping=early_stopping,
        dtype=precision,
        checkpoint=checkpoint,
        sampling=sampling,
        no_repeat_ngram_size=no_repeat_ngram_size,
        alignment_layer=-1 if alignment_layer is None else alignment_layer,
        length_penalty=length_penalty,
    )
