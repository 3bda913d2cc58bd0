"""The `keras-transformer` command line: one entry point, one subcommand per task.

Each pipeline module contributes its subcommands through
`register_commands(subparsers)`, which adds parsers whose `func` default runs
the command and returns an exit code.
"""

import argparse
import importlib
import os
import sys

# Modules that define `register_commands(subparsers)`, in the order of --help.
COMMAND_MODULES = (
    "keras_transformer.training",
    "keras_transformer.translator",
    "keras_transformer.attention_maps",
    "keras_transformer.export",
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, evaluate, inspect and export the Transformer of Vaswani et al. (2017).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register_commands(subparsers)
    return parser


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
