"""Ensembles of trained models: several run directories or exports loaded as one `Ensemble`, translated, exported.

An ensemble's models must share one vocabulary: their SentencePiece models
are compared before any model is loaded (`data.tokenizer.vocabulary_difference`:
the same pieces, scores, normalization and trainer options; only the paths
training recorded may differ), and a difference is refused naming both
files. The models are loaded in one precision: the one given, else the
first model's own. See `keras_transformer.ensemble` for how their
log-probabilities combine.

- `load_ensemble(paths, weights)`: `(Ensemble, Tokenizer)`;
- `ensemble_translator(paths, weights, **options)`: a `Translator` of the ensemble;
- `export_ensemble(paths, output_dir, weights, ...)`: one SavedModel holding
  every model, which translates as the `Translator` does. Its `export.json`
  records the members (their paths, weights and configurations) as its
  `model`, and `saved_model.reexport` rebuilds the ensemble from it.

Example:
    `keras-transformer translate --model runs/a --model runs/b --weights 2 1` is
    `ensemble_translator(["runs/a", "runs/b"], weights=[2, 1]).translate(sentences)`.
"""

import dataclasses
import importlib.util
import logging
import os

from keras_transformer.errors import ParameterError
from keras_transformer.inference.export_dirs import is_export_dir, list_versions
from keras_transformer.inference.export_sources import RUN_DECODING_DEFAULTS, DecodingOptions, load_export
from keras_transformer.run_dir import CONFIG_FILENAME, TOKENIZER_FILENAME

logger = logging.getLogger(__name__)


def member_directory(path):
    """`(directory, vocabulary file)` of an ensemble's model: a run directory, or an exported version.

    A base directory of exported versions stands for its highest version.

    Raises:
        FileNotFoundError: `path` is no directory.
        ValueError: it is neither a run directory nor an export written by keras-transformer.
    """
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such directory (expected a run directory or an exported SavedModel).")
    if os.path.exists(os.path.join(path, CONFIG_FILENAME)):
        return path, os.path.join(path, TOKENIZER_FILENAME)
    versions = [path] if is_export_dir(path) else [os.path.join(path, str(v)) for v in reversed(list_versions(path))]
    for version in versions:
        if is_export_dir(version):
            return version, os.path.join(version, "assets", TOKENIZER_FILENAME)
    raise ValueError(f"{path}: neither a run directory ({CONFIG_FILENAME}) nor an export written by keras-transformer.")


def check_same_vocabulary(vocabularies):
    """Refuses SentencePiece models (paths) that are not all the first one's vocabulary.

    Raises:
        ParameterError: ("models") naming both files and their first difference.
    """
    from keras_transformer.data.tokenizer import vocabulary_difference

    first = vocabularies[0]
    for other in vocabularies[1:]:
        difference = vocabulary_difference(first, other)
        if difference:
            raise ParameterError(
                "models",
                f"{first} and {other} are different vocabularies ({difference}); the models of an ensemble must "
                "share one.",
            )


def load_ensemble(paths, weights=None, dtype=None):
    """The models of `paths` (run directories or exports) as one `Ensemble`, and their tokenizer.

    Args:
        paths: two or more run directories (their final `model.keras`) or
            exported versions (or base directories, for their highest version).
        weights: one non-negative weight per model; default equal.
        dtype: the dtype policy every model computes in ("float32",
            "bfloat16", ...); default the first model's own.

    Returns:
        `(Ensemble, Tokenizer)`; the members are named by their paths.

    Raises:
        ParameterError: ("models") different vocabularies, ("weights") not one
            non-negative weight per model.
    """
    from keras_transformer.ensemble import Ensemble, normalized_weights
    from keras_transformer.run_dir import load_run

    paths = [os.fspath(path) for path in paths]
    normalized_weights(weights, len(paths))  # a bad weight is refused before the models load
    directories, vocabularies = zip(*(member_directory(path) for path in paths))
    check_same_vocabulary(vocabularies)
    models, tokenizer = [], None
    for directory in directories:
        if is_export_dir(directory):
            model, member_tokenizer, _ = load_export(directory, dtype=dtype)
        else:
            model, member_tokenizer = load_run(directory, dtype=dtype)
        dtype = dtype or model.dtype_policy.name  # the others in the first one's precision
        models.append(model)
        tokenizer = tokenizer or member_tokenizer
    return Ensemble(models, weights, names=paths), tokenizer


def ensemble_translator(paths, weights=None, dtype=None, **options):
    """A `Translator` of the ensemble of `paths` (`load_ensemble`); `options` are `Translator`'s.

    Example:
        `ensemble_translator(["runs/a", "runs/b"], beam_size=5).translate(["A dog runs."])`
    """
    from keras_transformer.inference.translator import Translator

    ensemble, tokenizer = load_ensemble(paths, weights, dtype)
    return Translator(ensemble, tokenizer, **options)


def export_ensemble(
    paths,
    output_dir,
    decoding=None,
    *,
    weights=None,
    dtype=None,
    version=None,
    overwrite=False,
    n_best=None,
    metadata=None,
    warmup_sentences="auto",
    **named,
):
    """Writes the ensemble of `paths` as one SavedModel to `output_dir/<version>/`; returns that path.

    The SavedModel holds every model's variables and translates as
    `ensemble_translator(paths, weights, dtype, ...)` does. `export.json`
    records the ensemble as its `model` (each member's path, weight and
    configuration), and `saved_model.reexport` rebuilds it from there.

    Args:
        paths, weights: as `load_ensemble`'s.
        output_dir: the model's base directory (TF Serving's `--model_base_path`).
        decoding: `DecodingOptions`, or their names as keywords (`beam_size=5`);
            those not given are §6.1's.
        dtype: as `saved_model.export_run`'s: "auto" or None picks bfloat16
            where this machine computes it natively, else float32.
        version, overwrite, n_best, metadata: as `saved_model.export_translator`'s.
        warmup_sentences: None, a list of sentences, or "auto": the
            validation sources of the first run directory among `paths`
            whose data can be read here (none if there is none).

    Returns:
        `output_dir/<version>` (str).
    """
    from keras_transformer.inference.precision import resolve_decoding_precision
    from keras_transformer.inference.saved_model import export_translator

    decoding = dataclasses.replace(decoding or DecodingOptions(), **named)
    dtype, _ = resolve_decoding_precision("auto" if dtype is None else dtype)
    if isinstance(warmup_sentences, str) and warmup_sentences == "auto":
        warmup_sentences = _validation_sources(paths)
    options = {**RUN_DECODING_DEFAULTS, **decoding.given()}
    translator = ensemble_translator(paths, weights, dtype, **options)
    return export_translator(
        translator,
        output_dir,
        version=version,
        overwrite=overwrite,
        n_best=n_best,
        metadata=metadata,
        warmup_sentences=warmup_sentences,
    )


def _validation_sources(paths):
    """The validation sources of the first run among `paths` whose data can be read, or None (logged)."""
    import tensorflow as tf

    from keras_transformer.inference.serving_warmup import run_validation_sources

    if importlib.util.find_spec("tensorflow_serving") is None:
        logger.info("No TensorFlow Serving warm-up requests written: tensorflow-serving-api is not installed.")
        return None
    for path in paths:
        if not os.path.isfile(os.path.join(os.fspath(path), CONFIG_FILENAME)):
            continue
        try:
            sentences = run_validation_sources(path)
        except (OSError, ValueError, tf.errors.OpError) as error:
            logger.warning("The validation data of %s could not be read (%s).", path, error)
            continue
        if sentences:
            return sentences
    logger.info("No TensorFlow Serving warm-up requests written: no run among %s has validation data here.", paths)
    return None
