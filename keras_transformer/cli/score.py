"""`keras-transformer score`: log P(target | source) of each sentence pair (forced decoding)."""

import sys

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.decoding_options import run_translator_from_args
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.text_files import read_lines
from keras_transformer.errors import ParameterError


def register(subparsers):
    parser = subparsers.add_parser(
        "score",
        help=COMMAND_HELP["score"],
        description="Prints one score per line: log P(target | source), summed over the target's tokens and "
        "its end token (--normalize: divided by their number). Needs a training run directory.",
    )
    parser.add_argument("--model", required=True, help="training run directory (required)")
    parser.add_argument("--src", required=True, help="source sentences, one per line (required)")
    parser.add_argument("--tgt", required=True, help="target sentences, one per line, aligned with --src (required)")
    parser.add_argument(
        "--normalize", action="store_true", help="divide each score by its number of tokens (default: the sum)"
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="a checkpoint path (or 'latest') instead of model.keras (default: model.keras)",
    )
    parser.add_argument("--batch-size", type=int, default=64, help="pairs per call (default 64)")
    parser.set_defaults(func=run)


def run(args):
    from keras_transformer.inference.scoring import TargetTooLongError, score_pairs
    from keras_transformer.inference.translator import is_saved_model

    if is_saved_model(args.model):
        raise CommandError(
            f"{args.model} is an exported SavedModel, which translates but does not score; "
            "give the training run directory."
        )
    sources, targets = read_lines(args.src, "--src"), read_lines(args.tgt, "--tgt")
    if len(sources) != len(targets):
        raise CommandError(f"{args.src} has {len(sources)} lines but {args.tgt} has {len(targets)}.")
    if args.batch_size < 1:  # checked before the model loads
        raise CommandError(f"--batch-size must be at least 1, got {args.batch_size}.")
    translator = run_translator_from_args(args, checkpoint=args.checkpoint)
    try:
        scores = score_pairs(translator, sources, targets, batch_size=args.batch_size, normalize=args.normalize)
    except TargetTooLongError as error:
        raise CommandError(
            f"{args.tgt} line {error.index + 1}: the target has {error.pieces} pieces, more "
            f"than the {error.max_pieces} the model's learned positions allow."
        ) from None
    except ParameterError:
        raise  # named by its flag (`cli.main`)
    except ValueError as error:
        raise CommandError(str(error)) from None
    for score in scores:
        sys.stdout.write(f"{score:.6f}\n")
    return 0
