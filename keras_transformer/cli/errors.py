"""How every command fails: one line on stderr, `keras-transformer COMMAND: what went wrong, and where`.

A command raises `CommandError` for what it refuses; `main` turns that, a
library's `ParameterError` (named by its flag) and any other exception into
one line and an exit status, as argparse does for a bad flag:

- 2 (`USAGE`): bad input or usage: a flag's value, a missing file, a
  directory given for a file, an empty file, a model the command cannot use;
- 1 (`FAILURE`): a failure at run time (a full disk, an error inside
  TensorFlow, a bug);
- 130 (`INTERRUPTED`): Ctrl-C, as shells report a process SIGINT ended;
  128 + N for another signal N (143 for SIGTERM, which stops training
  after a checkpoint).

The traceback is printed too only when asked for: `keras-transformer --debug
COMMAND ...` or `KERAS_TRANSFORMER_DEBUG=1` in the environment.
"""

import errno
import os
import sys
import traceback

USAGE = 2
FAILURE = 1
INTERRUPTED = 130

# Set to anything but "" or "0": tracebacks as well as the one line.
DEBUG_ENVIRONMENT = "KERAS_TRANSFORMER_DEBUG"

# TensorFlow's errors for a file that is missing, a directory, or unreadable: the user's input.
_TF_INPUT_ERRORS = ("NotFoundError", "FailedPreconditionError", "PermissionDeniedError")
# Errno values that mean the path the user gave is wrong (not the machine).
_INPUT_ERRNOS = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.EACCES, errno.EPERM)


class CommandError(Exception):
    """What a command refuses or cannot do, said in one line (without the command's name).

    Args:
        message: what went wrong, and where (a flag as typed, a path, a line number).
        exit_code: `USAGE` (default) for bad input, `FAILURE` for a failure at run time.
    """

    def __init__(self, message, exit_code=USAGE):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


class CommandExit(SystemExit):
    """The `SystemExit` a failed command ends with, once its line is printed.

    Its `code` is the exit status (so the interpreter prints nothing more);
    `str()` is `"COMMAND: message"`, the printed line without the program
    name (`command` is None for a failure before a command was chosen).

    Example:
        >>> error = CommandExit("translate", "--input x: no such file", USAGE)
        >>> error.code, str(error), error.line
        (2, 'translate: --input x: no such file', 'keras-transformer translate: --input x: no such file')
    """

    def __init__(self, command, message, code):
        super().__init__(code)
        self.command = command
        self.message = message

    @property
    def line(self):
        return f"keras-transformer: {self.message}" if self.command is None else f"keras-transformer {self}"

    def __str__(self):
        return self.message if self.command is None else f"{self.command}: {self.message}"


def debug_requested(flag=False):
    """True when `--debug` was given or `KERAS_TRANSFORMER_DEBUG` asks for tracebacks."""
    return bool(flag) or os.environ.get(DEBUG_ENVIRONMENT, "").strip() not in ("", "0")


def first_line(text):
    """The first non-blank line of `text`, stripped (a multi-line library message is cut to it).

    Example:
        >>> first_line("\\nbad value\\n  at node x\\n")
        'bad value'
    """
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def describe(error):
    """`(message, exit_code)` for an exception a command did not catch itself."""
    if isinstance(error, CommandError):
        return error.message, error.exit_code
    if isinstance(error, OSError) and not isinstance(error, (ConnectionError, TimeoutError)):
        code = USAGE if error.errno in _INPUT_ERRNOS or isinstance(error, FileNotFoundError) else FAILURE
        if error.filename is not None and error.strerror:
            return f"{error.filename}: {error.strerror}", code
        return first_line(error) or type(error).__name__, code
    if type(error).__module__.startswith("tensorflow") and hasattr(error, "message"):  # a tf.errors.OpError
        code = USAGE if type(error).__name__ in _TF_INPUT_ERRORS else FAILURE
        return first_line(error.message), code
    if isinstance(error, ValueError):  # the library's refusal of a value it was given
        return first_line(error), USAGE
    text = first_line(error)
    return (f"{type(error).__name__}: {text}" if text else type(error).__name__), FAILURE


def fail(command, message, code, debug=False):
    """Prints `keras-transformer COMMAND: message` on stderr (after the traceback if `debug`) and raises.

    Raises:
        CommandExit: always, with `code` as the exit status.
    """
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    exit_ = CommandExit(command, message, code)
    sys.stdout.flush()
    print(exit_.line, file=sys.stderr, flush=True)
    raise exit_ from None
