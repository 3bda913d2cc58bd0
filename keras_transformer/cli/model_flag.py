"""`--model`, the flag that names the model a command reads, with the positional form it replaces.

`export` and `average-checkpoints` took their run directory as a positional
argument where the other commands take `--model`; both forms are accepted
(the positional one is deprecated, and said so in `--help`).
"""

from keras_transformer.cli.errors import CommandError

POSITIONAL_DEST = "model_positional"


def add_model_flag(parser, help, metavar="RUN_DIR"):
    """Adds `--model PATH` and the deprecated positional `RUN_DIR` to `parser`."""
    parser.add_argument("--model", default=None, metavar="PATH", help=f"{help} (required)")
    parser.add_argument(
        POSITIONAL_DEST,
        nargs="?",
        default=None,
        metavar=metavar,
        help=f"deprecated: give --model {metavar} instead (still accepted)",
    )


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
