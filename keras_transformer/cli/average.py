"""`keras-transformer average-checkpoints`: the mean of a run's last K checkpoints (§6.1)."""

import os

from keras_transformer.cli.errors import CommandError


def register(subparsers):
    parser = subparsers.add_parser(
        "average-checkpoints",
        help="average the last K checkpoints of a run into one model (§6.1)",
        description="Writes the element-wise mean of the weights of the last K checkpoints of RUN_DIR. "
        "Give the output to translate/evaluate/export with --checkpoint.",
    )
    parser.add_argument("run_dir", metavar="RUN_DIR")
    parser.add_argument("--last", type=int, default=5, help="K: checkpoints to average (default 5; §6.1)")
    parser.add_argument("--output", help="output .keras or .weights.h5 (default RUN_DIR/model-avg{K}.keras)")
    parser.set_defaults(func=run)


def run(args):
    if args.last < 1:  # checked before anything is read
        raise CommandError(f"--last must be at least 1, got {args.last}.")
    from keras_transformer.training.averaging import write_averaged_model

    try:
        output, chosen = write_averaged_model(args.run_dir, args.last, args.output)
    except (FileNotFoundError, ValueError) as error:  # no checkpoints, no config.json, a config it refuses
        raise CommandError(str(error)) from None
    print(f"Averaged {len(chosen)} checkpoints of {args.run_dir} into {output}:")
    for path in chosen:
        print(f"  {os.path.basename(path)}")
    return 0
