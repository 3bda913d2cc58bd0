"""`--model`, the flag that names the model a command reads, with the positional form it replaces.

`export` and `average-checkpoints` took their run directory as a positional
argument where the other commands take `--model`; both forms are accepted
(the positional one is deprecated, and said so in `--help`).

`translate`, `evaluate` and `export` take `--model` more than once, for an
ensemble of models of one vocabulary (`keras_transformer.ensemble`), with
`--weights`, one per model.
"""

import argparse
import contextlib
import os

from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.startup import native_logs_silenced
from keras_transformer.errors import ParameterError

POSITIONAL_DEST = "model_positional"

ENSEMBLE_HELP = (
    "; repeat --model to decode an ensemble of models that share a vocabulary (their log-probabilities "
    "averaged at every step, log-linear)"
)


class ModelsAction(argparse.Action):
    """`--model PATH`, repeatable: `args.models` lists every path given, `args.model` is the first.

    So a command that reads one model reads `args.model` as before.
    """

    def __call__(self, parser, namespace, values, option_string=None):
        models = [*(getattr(namespace, "models", None) or []), values]
        namespace.models = models
        if len(models) == 1:
            setattr(namespace, self.dest, values)


def add_model_flag(parser, help, metavar="RUN_DIR", ensemble=False):
    """Adds `--model PATH` and the deprecated positional `RUN_DIR` to `parser`.

    `ensemble`: both may be given more than once (`model_paths`), with `--weights`.
    """
    if ensemble:
        parser.add_argument(
            "--model", action=ModelsAction, default=None, metavar="PATH", help=f"{help} (required){ENSEMBLE_HELP}"
        )
        parser.set_defaults(models=[])
        add_weights_flag(parser)
    else:
        parser.add_argument("--model", default=None, metavar="PATH", help=f"{help} (required)")
    parser.add_argument(
        POSITIONAL_DEST,
        nargs="*" if ensemble else "?",
        default=None,
        metavar=metavar,
        help=f"deprecated: give --model {metavar} instead (still accepted)",
    )


def add_models_flags(parser, help):
    """Adds the required, repeatable `--model PATH` (an ensemble when repeated) and `--weights` to `parser`."""
    parser.add_argument("--model", action=ModelsAction, required=True, metavar="PATH", help=f"{help}{ENSEMBLE_HELP}")
    parser.set_defaults(models=[])
    add_weights_flag(parser)


def add_weights_flag(parser):
    parser.add_argument(
        "--weights",
        type=_weight,
        nargs="+",
        default=None,
        metavar="W",
        help="with several --model: one non-negative weight per model, in their order, scaled to sum to 1 "
        "(default: equal), e.g. --model runs/a --model runs/b --weights 2 1; sentences given as arguments go "
        "before it, or after --",
    )


def _weight(text):
    """A `--weights` value: a number (argparse reports the refusal, naming the flag)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a number (give sentences before --weights, or after --)"
        ) from None


def model_path(args):
    """The model `args` names, by `--model` or positionally.

    Raises:
        CommandError: neither given, or both given with different values.

    Example:
        >>> import argparse
        >>> model_path(argparse.Namespace(model=None, model_positional="runs/a"))
        'runs/a'
    """
    flag, positional = args.model, getattr(args, POSITIONAL_DEST, None)
    if flag is not None and positional is not None and flag != positional:
        raise CommandError(f"--model {flag} and RUN_DIR {positional}: give the model once, with --model.")
    if flag is None and positional is None:
        raise CommandError("give the model with --model PATH.")
    return flag if flag is not None else positional


def model_paths(args):
    """Every model `args` names (a flag added with `ensemble=True`): by `--model`, or positionally.

    Raises:
        CommandError: none given, or both forms given with different paths.

    Example:
        >>> import argparse
        >>> model_paths(argparse.Namespace(models=[], model_positional=["runs/a", "runs/b"]))
        ['runs/a', 'runs/b']
    """
    flags, positional = list(args.models or []), list(getattr(args, POSITIONAL_DEST, None) or [])
    if flags and positional and flags != positional:
        given = " ".join(f"--model {path}" for path in flags)
        raise CommandError(f"{given} and RUN_DIR {' '.join(positional)}: give the models once, with --model.")
    if not flags and not positional:
        raise CommandError("give the model with --model PATH.")
    return flags or positional


def ensemble_paths(paths, weights):
    """`paths` if they are an ensemble (two or more), else None, once `weights` (or None) fit them.

    Raises:
        ParameterError: ("weights", named `--weights` by `cli.main`) not one
            non-negative weight per model, or all 0: refused before any model loads.
    """
    if weights is not None:
        from keras_transformer.ensemble import normalized_weights

        normalized_weights(weights, len(paths))
    return list(paths) if len(paths) > 1 else None


def ensemble_translator_from_args(args, sampling=None, alignment_layer=None):
    """The `Translator` of the ensemble of every `--model` (two or more), with the decoding flags (and
    `alignment_layer`, if not None).

    Run directories and exported versions alike are loaded as models
    (`inference.ensembles.load_ensemble`), in `--precision` (default: the
    first model's own).

    Raises:
        CommandError: a missing model, `--checkpoint` (which names one run's
            checkpoint), models of different vocabularies (naming both
            SentencePiece files) or one that cannot be loaded.
    """
    for path in args.models:
        if not os.path.isdir(path):
            raise CommandError(f"--model {path}: no such directory (expected a run directory or a SavedModel).")
    if args.checkpoint is not None:
        raise CommandError(f"--checkpoint {args.checkpoint}: applies to one --model, not to an ensemble.")
    from keras_transformer.inference.ensembles import ensemble_translator

    with _ensemble_loading_errors():
        return ensemble_translator(
            args.models,
            args.weights,
            args.precision,
            beam_size=args.beam,
            alpha=args.alpha,
            max_extra_length=args.max_extra_length,
            early_stopping=args.early_stopping,
            sampling=sampling,
            no_repeat_ngram_size=args.no_repeat_ngram_size,
            length_penalty=args.length_penalty,
            **({} if alignment_layer is None else {"alignment_layer": alignment_layer}),
        )


@contextlib.contextmanager
def _ensemble_loading_errors():
    """A `CommandError` (one line) for models an ensemble cannot take or load; the loading's C++ logging silenced.

    A `ParameterError` for "models" (different vocabularies) becomes
    `--model: message`; the others stay named by their flags (`cli.main`).
    """
    import tensorflow as tf

    try:
        with native_logs_silenced():
            yield
    except ParameterError as error:
        if error.parameter == "models":
            raise CommandError(f"--model: {error.message}") from None
        raise
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from None
    except tf.errors.NotFoundError as error:  # e.g. a run directory without its spm.model
        raise CommandError(f"--model: {error.message}") from None
