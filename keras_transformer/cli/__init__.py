"""The `keras-transformer` command line: one entry point, one small module per command.

Each command module has `register(subparsers)`, which adds its parser (with
`func` set to its `run`), and `run(args)`, which imports what the command
needs and returns an exit code. Registering imports the package (the model,
and with it Keras and TensorFlow) and the modules that define the flags'
defaults and choices, but none of a command's own modules (the translator,
the exports, the data pipeline, the training loop) and none of the
libraries they need (SentencePiece, tensorflow-text, TFDS, sacreBLEU,
CTranslate2): `keras-transformer --help` loads no library that `import
keras_transformer` does not.
"""

import argparse
import importlib
import os
import sys

# Command modules, in the order of --help.
COMMAND_MODULES = (
    "keras_transformer.cli.train",
    "keras_transformer.cli.average",
    "keras_transformer.cli.translate",
    "keras_transformer.cli.evaluate",
    "keras_transformer.cli.score",
    "keras_transformer.cli.attention",
    "keras_transformer.cli.export",
)


def build_parser():
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, evaluate, inspect and export the Transformer of Vaswani et al. (2017).",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    args = build_parser().parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
