"""`keras-transformer average-checkpoints`: the mean of a run's last K checkpoints (§6.1)."""

import os
import sys

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.model_flag import add_model_flag, model_path


def register(subparsers):
    parser = subparsers.add_parser(
        "average-checkpoints",
        help=COMMAND_HELP["average-checkpoints"],
        description="Writes the element-wise mean of the weights of the last K checkpoints of the run --model. "
        "Give the output to translate/evaluate/export with --checkpoint.",
    )
    add_model_flag(parser, "training run directory whose checkpoints/ to average")
    parser.add_argument("--last", type=int, default=5, help="K: checkpoints to average (default 5; §6.1)")
    parser.add_argument(
        "--output",
        help="output .keras or .weights.h5 (default: RUN_DIR/model-avg{N}.keras in the run, N the "
        "checkpoints averaged: K, or all of them when fewer)",
    )
    parser.set_defaults(func=run)


def run(args):
    if args.last < 1:  # checked before anything is read
        raise CommandError(f"--last must be at least 1, got {args.last}.")
    run_dir = model_path(args)
    from keras_transformer.training.averaging import write_averaged_model

    try:
        output, chosen = write_averaged_model(run_dir, args.last, args.output)
    except (FileNotFoundError, ValueError) as error:  # no checkpoints, no config.json, a config it refuses
        raise CommandError(str(error)) from None
    if len(chosen) < args.last:
        print(
            f"keras-transformer average-checkpoints: warning: --last {args.last}, but only {len(chosen)} "
            f"checkpoint{'s' if len(chosen) != 1 else ''} to average in {run_dir}.",
            file=sys.stderr,
            flush=True,
        )
    print(f"Averaged {len(chosen)} checkpoints of {run_dir} into {output}:")
    for path in chosen:
        print(f"  {os.path.basename(path)}")
    return 0
