"""What an export writes: the `Translator` of a run directory, of an earlier export, or with other decoding options.

A SavedModel is written from a `Translator` (`saved_model.export_translator`).
This module builds that `Translator` for each kind of source:

- `translator_of_run`: a training run directory's final model or a
  checkpoint, with §6.1's decoding options unless given;
- `translator_of_export`: an exported version's model rebuilt from its
  `export.json` and variables (`load_export`), with the decoding options it
  records unless given, so that it can be written again with this
  version's graph;
- `with_decoding`: a `Translator` with some of its decoding options changed.

`n_best_to_export` settles the N of an export's "translate_n_best" signature.

`DecodingOptions` names the options that an export fixes in its graph.
"""

from __future__ import annotations

import dataclasses
import os
import re

from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    DEFAULT_LENGTH_PENALTY,
    EXTRA_OUTPUT_LENGTH,
)
from keras_transformer.errors import ParameterError
from keras_transformer.inference.export_dirs import INFO_FILENAME, list_versions, read_export_info
from keras_transformer.run_dir import CONFIG_FILENAME, TOKENIZER_FILENAME


@dataclasses.dataclass(frozen=True)
class DecodingOptions:
    """The decoding options an export fixes in its graph; None: the source's own.

    A run directory's own are §6.1's (beam 4, alpha 0.6, 50 extra tokens,
    "exact" early stopping, GNMT's length penalty, the model's `max_length`,
    no n-gram blocking, alignments from the last decoder layer), an export's
    are those its `export.json` records, a `Translator`'s its attributes.
    `no_repeat_ngram_size` is recorded only when it is on (> 0),
    `alignment_layer` only when it is not the last layer (-1),
    `length_penalty` only when it is not "gnmt".

    Example:
        >>> DecodingOptions(beam_size=1).given()
        {'beam_size': 1}
    """

    beam_size: int | None = None
    alpha: float | None = None
    max_extra_length: int | None = None
    max_input_length: int | None = None
    early_stopping: str | None = None
    no_repeat_ngram_size: int | None = None
    max_input_bytes: int | None = None
    alignment_layer: int | None = None
    length_penalty: str | None = None

    def given(self):
        """The options given, as a dict (those that are not None)."""
        return {name: value for name, value in dataclasses.asdict(self).items() if value is not None}


DECODING_OPTION_NAMES = tuple(field.name for field in dataclasses.fields(DecodingOptions))

# A run directory's own decoding options (§6.1).
RUN_DECODING_DEFAULTS = dict(
    beam_size=DEFAULT_BEAM_SIZE,
    alpha=DEFAULT_ALPHA,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    max_input_length=None,
    early_stopping=DEFAULT_EARLY_STOPPING,
    no_repeat_ngram_size=0,
    max_input_bytes=None,
    alignment_layer=-1,
    length_penalty=DEFAULT_LENGTH_PENALTY,
)


def with_decoding(translator, decoding=None):
    """`translator` itself, or a `Translator` of the same model, tokenizer, request limit and sampling with the
    decoding options that `decoding` (`DecodingOptions`) changes."""
    from keras_transformer.inference.translator import Translator

    current = {name: getattr(translator, name) for name in DECODING_OPTION_NAMES}
    changes = {k: v for k, v in (decoding or DecodingOptions()).given().items() if v != current[k]}
    if not changes:
        return translator
    _follow_input_length(current, changes, current)
    return Translator(
        translator.model,
        translator.tokenizer,
        **{**current, **changes},
        max_batch_size=translator.max_batch_size,
        sampling=translator.sampling,
        jit_compile=translator._jit_compile,
    )


def translator_of_run(run_dir, decoding=None, checkpoint=None, dtype=None):
    """The `Translator` of a run directory's final model (or `checkpoint`) under `dtype`, with `decoding`.

    Raises:
        FileNotFoundError: `run_dir` is no directory.
        ValueError: `run_dir` is a SavedModel not written by this package, or
            the base directory of exported versions.
    """
    from keras_transformer.inference.translator import Translator
    from keras_transformer.run_dir import load_run

    path = os.fspath(run_dir)
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
                f"{path} holds exported versions; give one, e.g. {os.path.join(path, str(list_versions(path)[-1]))}."
            )
    model, tokenizer = load_run(path, checkpoint=checkpoint, dtype=dtype)
    options = {**RUN_DECODING_DEFAULTS, **(decoding or DecodingOptions()).given()}
    return Translator(model, tokenizer, **options)


def translator_of_export(export_dir, decoding=None, dtype=None):
    """The `Translator` of an exported version's model (`load_export`), with the decoding options and request
    limit its `export.json` records unless `decoding` gives others."""
    from keras_transformer.inference.translator import Translator

    model, tokenizer, info = load_export(export_dir, dtype=dtype)
    recorded = info.get("decoding", {})
    options = {**RUN_DECODING_DEFAULTS, **{k: v for k, v in recorded.items() if k in DECODING_OPTION_NAMES}}
    given = (decoding or DecodingOptions()).given()
    options.update(given)
    _follow_input_length(options, given, recorded)
    limits = dict(max_batch_size=recorded["max_batch_size"]) if recorded.get("max_batch_size") else {}
    return Translator(model, tokenizer, **limits, **options)


def _follow_input_length(options, given, previous):
    """Lets a bytes bound that was the default for the previous `max_input_length` (`BYTES_PER_TOKEN` per token)
    follow a new one given without a bound of its own: `options["max_input_bytes"]` becomes None (the default)."""
    from keras_transformer.inference.translator import BYTES_PER_TOKEN

    if "max_input_length" not in given or "max_input_bytes" in given:
        return
    if previous.get("max_input_bytes") == BYTES_PER_TOKEN * (previous.get("max_input_length") or 0):
        options["max_input_bytes"] = None


def run_training_options(run_dir):
    """How a run's model was trained: the options its `config.json` records, or None."""
    from keras_transformer.run_dir import read_config

    if not os.path.exists(os.path.join(run_dir, CONFIG_FILENAME)):
        return None
    return read_config(run_dir).get("training")


def _variable_key(name):
    """A variable's name without what Keras makes unique per process: the model's own name (the first part)
    and seed generators' numbers ("transformer_3/encoder/layer_0/.../seed_generator_14/...:0" ->
    "encoder/layer_0/.../seed_generator/...")."""
    return re.sub(r"seed_generator_\d+", "seed_generator", name.split(":")[0].split("/", 1)[-1])


def load_export(export_dir, dtype=None):
    """The model and tokenizer inside an exported version: `(Transformer, Tokenizer, export.json as a dict)`.

    An export's graph is traced once and for all: one written by an older
    version decodes with that version's search. This rebuilds the
    `Transformer` that its `export.json` describes (an `Ensemble` for an
    ensemble's export, `inference.ensembles`), under `dtype` (default
    the precision it was exported in), and loads the weights its variables
    hold, so `saved_model.reexport(export_dir, ...)` writes the same model
    with this version's graph. (The weights are those the export stores: a
    bfloat16 export's are bfloat16 values, whatever `dtype`.)

    Raises:
        ValueError: the export records no model, or its variables are not
            the described model's (another number, name or shape).
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the export's tokenizer ops)

    from keras_transformer.config import TransformerConfig
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.run_dir import build_model

    export_dir = os.fspath(export_dir)
    info = read_export_info(export_dir)
    if not info.get("model"):
        raise ValueError(f"{export_dir}: its {INFO_FILENAME} records no model configuration to rebuild.")
    if "ensemble" in info["model"]:  # several models' variables, member after member (`inference.ensembles`)
        from keras_transformer.ensemble import Ensemble

        model = Ensemble.from_config(info["model"], dtype=dtype or info["precision"])
    else:
        model = build_model(TransformerConfig.from_dict(info["model"]), dtype=dtype or info["precision"])
    saved = tf.saved_model.load(export_dir).model_variables
    problem = _variables_problem(model.variables, saved)
    if problem:
        raise ValueError(
            f"{export_dir}: its variables are not those of the model its {INFO_FILENAME} describes: {problem}."
        )
    for variable, value in zip(model.variables, saved):
        variable.assign(value)
    if hasattr(model, "compile"):  # a Transformer; an Ensemble is only decoded
        model.compile()
    return model, Tokenizer(os.path.join(export_dir, "assets", TOKENIZER_FILENAME)), info


def _variables_problem(variables, saved):
    """What keeps the export's `saved` variables from being the model's `variables`, or None."""
    if len(saved) != len(variables):
        return f"the model has {len(variables)} variables, the export {len(saved)}"
    for index, (variable, value) in enumerate(zip(variables, saved)):
        if (_variable_key(variable.path), tuple(variable.shape)) != (_variable_key(value.name), tuple(value.shape)):
            return (
                f"variable {index} is {value.name} {tuple(value.shape)} in the export, "
                f"{variable.path} {tuple(variable.shape)} in the model"
            )
    return None


def n_best_to_export(n_best, recorded, translator, source):
    """The N of the "translate_n_best" signature to write, or None for none (`n_best` 0 or None, nothing recorded).

    An export's own N (`recorded`) holds unless `n_best` is given; one that a
    smaller new beam cannot give is refused with where it came from.
    """
    if n_best is None and recorded is not None:
        if recorded > translator.beam_size:
            raise ParameterError(
                "n_best",
                f"must be given: {source} has a translate_n_best signature of the {recorded} best, more than the "
                f"beam size {translator.beam_size} gives; give at most {translator.beam_size}, or 0 for no n-best "
                "signature.",
            )
        n_best = recorded
    if n_best is None or (n_best == 0 and not isinstance(n_best, bool)):
        return None
    import tensorflow as tf

    translator.n_best_strings(tf.constant([], tf.string), n_best)  # refuses a bad n_best before writing
    return n_best
