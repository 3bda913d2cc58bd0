"""The `keras-transformer` command line: one entry point, one small module per command.

Each command module has `register(subparsers)`, which adds its parser (with
`func` set to its `run`), and `run(args)`, which imports what the command
needs and returns an exit code. `main` answers `--version`, `--help` and a
bare `keras-transformer` from `cli.commands` alone; it parses the command
line before loading TensorFlow, so that `COMMAND --help` and a usage error
answer without it too. Registering imports the modules that define the
flags' defaults and choices, but none of a command's own modules (the
translator, the exports, the data pipeline, the training loop) and none of
the libraries they need (TensorFlow, Keras, SentencePiece, tensorflow-text,
TFDS, sacreBLEU, CTranslate2). Then TensorFlow loads with its start-up
logging silenced (`cli.startup`), and the command runs.
"""

import argparse
import importlib
import sys

from keras_transformer.cli import startup
from keras_transformer.cli.commands import COMMAND_HELP, COMMANDS
from keras_transformer.cli.errors import (
    DEBUG_ENVIRONMENT,
    INTERRUPTED,
    USAGE,
    CommandExit,
    debug_requested,
    describe,
    fail,
)
from keras_transformer.cli.startup import (
    TF_LOGS_ENVIRONMENT,
    TF_LOGS_HELP,
    VERSION,
    global_flags,
    import_tensorflow_quietly,
    tensorflow_logs_requested,
)
from keras_transformer.errors import ParameterError

# Command modules, in the order of --help.
COMMAND_MODULES = tuple(module for module, _ in COMMANDS.values())


# The flags that set the library's parameters, per command: a `ParameterError` names the parameter, the
# command line the flag the user typed.
_DECODING_FLAGS = {
    "beam_size": "--beam",
    "alpha": "--alpha",
    "max_extra_length": "--max-extra-length",
    "early_stopping": "--early-stopping",
    "no_repeat_ngram_size": "--no-repeat-ngram-size",
    "length_penalty": "--length-penalty",
}
_MODEL_FLAGS = {
    **_DECODING_FLAGS,
    "precision": "--precision",
    "dtype": "--precision",
    "checkpoint": "--checkpoint",
    "batch_size": "--batch-size",
    "weights": "--weights",
}
PARAMETER_FLAGS = {
    "train": {},  # every TrainingArgs field is set by the flag of its name (`parameter_error_message`)
    "average-checkpoints": {},
    "translate": {
        **_MODEL_FLAGS,
        "n_best": "--n-best",
        "target_prefixes": "--target-prefix",
        "alignments": "--alignments",
        "alignment_layer": "--alignment-layer",
        "top_k": "--sampling-topk",
        "temperature": "--sampling-temperature",
    },
    "evaluate": _MODEL_FLAGS,
    "score": {"checkpoint": "--checkpoint", "batch_size": "--batch-size"},
    "attention": {"beam_size": "--beam", "alpha": "--alpha", "max_extra_length": "--max-extra-length"},
    "export": {
        **_DECODING_FLAGS,
        "max_input_length": "--max-input-length",
        "max_input_bytes": "--max-input-bytes",
        "checkpoint": "--checkpoint",
        "dtype": "--precision",
        "n_best": "--n-best",
        "version": "--version",
        "warmup_sentences": "--warmup-sentences",
        "weights": "--weights",
        "alignment_layer": "--alignment-layer",
    },
}


def interrupted(error):
    """`(message, exit_status)` for a command a signal stopped: 130 for SIGINT (Ctrl-C), 128 + N for signal N.

    Training stopped by SIGINT or SIGTERM (`training.callbacks.TrainingInterrupted`,
    which carries the signal and the step it saved) says how to go on.

    Example:
        >>> interrupted(KeyboardInterrupt())
        ('interrupted.', 130)
    """
    signum = getattr(error, "signal", None)
    if signum is None:
        return "interrupted.", INTERRUPTED
    return f"interrupted ({error}); run the same command again to resume from its checkpoint.", 128 + int(signum)


def run_script(main, name):
    """Exits with `main()`'s status; a signal that stops it ends it as it ends a command: one line, no traceback.

    For the example scripts, which train through the library like
    `keras-transformer train`: Ctrl-C or SIGTERM during training writes a
    checkpoint and raises `training.callbacks.TrainingInterrupted`, and the
    script then exits with `interrupted`'s line on stderr and the shell's
    status (130, 143).

    Args:
        main: the script's `main`, called with no arguments; its return
            value is the exit status (None: 0).
        name: the script's name, which begins its error line.

    Example:
        >>> def stopped():
        ...     raise KeyboardInterrupt
        >>> run_script(stopped, "demo.py")
        Traceback (most recent call last):
        SystemExit: 130
    """
    try:
        status = main()
    except KeyboardInterrupt as error:
        message, status = interrupted(error)
        sys.stdout.flush()
        print(f"{name}: {message}", file=sys.stderr, flush=True)
    raise SystemExit(status)


def parameter_error_message(command, args, error):
    """`--flag VALUE: message` for a `ParameterError` that `command` raised, as its error line says it.

    Example:
        >>> import argparse
        >>> args = argparse.Namespace(n_best=2)
        >>> parameter_error_message("translate", args, ParameterError("n_best", "must be at most 1"))
        '--n-best 2: must be at most 1'
    """
    flag = PARAMETER_FLAGS.get(command, {}).get(error.parameter)
    if flag is None and command == "train" and hasattr(args, error.parameter):  # TrainingArgs field = flag
        flag = "--" + error.parameter.replace("_", "-")
    if flag is None:  # a parameter no flag of the command sets: named as the library names it
        return str(error)
    value = getattr(args, flag[2:].replace("-", "_"), None)
    if isinstance(value, list):  # a flag of several values (--weights 1 2), as typed
        value = " ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    given = f"{flag} {value}" if value is not None and not isinstance(value, bool) else flag
    return f"{given}: {error.message}"


ERRORS_HELP = (
    "Errors are one line on stderr; exit status 2 for bad input or usage, 1 for a failure at run time, "
    f"130 for Ctrl-C (128 + N for signal N); --debug (before COMMAND) or {DEBUG_ENVIRONMENT}=1 adds the traceback."
)


def build_parser(commands_only=False):
    """The command line's parser; with `commands_only`, its commands have no flags (enough for `--help`).

    `commands_only` loads no command module, so neither Keras nor TensorFlow.
    """
    parser = argparse.ArgumentParser(
        prog="keras-transformer",
        description="Train, evaluate, inspect and export the Transformer of Vaswani et al. (2017).",
        epilog=f"{TF_LOGS_HELP} {ERRORS_HELP}",
    )
    parser.add_argument("--version", action="version", version=f"keras-transformer {VERSION}")
    parser.add_argument(
        "--verbose-tf",
        action="store_true",
        help="show the C++ logging of TensorFlow and SentencePiece, silenced by default "
        f"(also: {TF_LOGS_ENVIRONMENT}=1)",
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        help=f"print the traceback of an error as well as its one line (also: {DEBUG_ENVIRONMENT}=1)",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    if commands_only:
        for name, help in COMMAND_HELP.items():
            subparsers.add_parser(name, help=help)
        return parser
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    for command in subparsers.choices.values():
        command.epilog = " ".join(filter(None, (command.epilog, TF_LOGS_HELP, ERRORS_HELP)))
    return parser


def main(argv=None):
    """The `keras-transformer` command: returns 0, or raises `SystemExit` with the exit status.

    A failure prints one line, `keras-transformer COMMAND: what went wrong, and
    where`, and ends with `errors.CommandExit` (a `SystemExit` whose `str()` is
    `"COMMAND: message"`): status 2 for bad input, 1 at run time, 130 for Ctrl-C, 143 for SIGTERM.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    if global_flags(argv) == ["--version"]:  # answered before anything loads TensorFlow
        print(f"keras-transformer {VERSION}")
        return 0
    if global_flags(argv) == argv and (not argv or {"-h", "--help"} & set(argv)):  # the commands, not one
        build_parser(commands_only=True).print_help()
        return 0
    try:
        args = build_parser().parse_args(argv)  # `COMMAND --help` and usage errors end here, without TensorFlow
        startup.native_logs_shown = tensorflow_logs_requested(argv)
        if not startup.native_logs_shown:
            import_tensorflow_quietly()
    except KeyboardInterrupt:  # while TensorFlow and the commands' modules load
        fail(None, "interrupted.", INTERRUPTED, debug_requested())
    debug = debug_requested(args.debug)
    try:
        return args.func(args) or 0
    except KeyboardInterrupt as error:
        fail(args.command, *interrupted(error), debug)
    except ParameterError as error:  # a value the library refuses: named by the flag that gave it
        fail(args.command, parameter_error_message(args.command, args, error), USAGE, debug)
    except CommandExit:
        raise
    except SystemExit as error:
        if not isinstance(error.code, str):
            raise
        message = error.code  # a message a library ended with: one line, without a repeated command name
        fail(args.command, message.removeprefix(f"{args.command}: "), USAGE, debug)
    except Exception as error:
        fail(args.command, *describe(error), debug)
