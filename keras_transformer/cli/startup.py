"""What the command line does before TensorFlow loads: its version, and quieting TensorFlow's start-up.

TensorFlow's C++ libraries log as they load (oneDNN's notice, "Could not
find cuda drivers", the CPU instructions it was not built for, each after
"WARNING: All log messages before absl::InitializeLog() is called are
written to STDERR"), and again when it looks for GPUs ("failed call to
cuInit" at error level on a machine without one). The lines before
`absl::InitializeLog` ignore `TF_CPP_MIN_LOG_LEVEL`, so the commands load
TensorFlow, and list its devices, with file descriptor 2 sent to the null
device, and set `TF_CPP_MIN_LOG_LEVEL=3` (unless the environment sets it)
for what it logs later. Python's own stderr is untouched outside that
import: errors, warnings and progress bars still show.

`--verbose-tf` (before the command's name) or `KERAS_TRANSFORMER_TF_LOGS=1`
leaves TensorFlow's logging as TensorFlow sets it.
"""

import contextlib
import os
import sys

from keras_transformer import __version__  # the package loads its model lazily: no TensorFlow here

VERSION = __version__
TF_LOGS_ENVIRONMENT = "KERAS_TRANSFORMER_TF_LOGS"
TF_LOGS_FLAG = "--verbose-tf"
TF_LOGS_HELP = (
    "The C++ logging of TensorFlow (its start-up) and SentencePiece is silenced; --verbose-tf (before "
    f"COMMAND) or {TF_LOGS_ENVIRONMENT}=1 shows it."
)


def global_flags(argv):
    """The options given before the command's name (the global ones).

    Example:
        >>> global_flags(["--debug", "translate", "--verbose-tf"])
        ['--debug']
    """
    flags = []
    for item in argv:
        if not item.startswith("-"):
            break
        flags.append(item)
    return flags


def tensorflow_logs_requested(argv):
    """True when `--verbose-tf` precedes the command or `KERAS_TRANSFORMER_TF_LOGS` is set (not "" or "0")."""
    return TF_LOGS_FLAG in global_flags(argv) or os.environ.get(TF_LOGS_ENVIRONMENT, "").strip() not in ("", "0")


# Set by `keras_transformer.cli.main`: TensorFlow's (and SentencePiece's) C++ logging is shown as they print it.
native_logs_shown = False
_python_stderr = None  # Python's stderr while fd 2 is silenced: a stream on a duplicate of the real fd 2


@contextlib.contextmanager
def native_logs_silenced():
    """While the block runs, what C++ code writes to fd 2 is dropped; what Python writes to `sys.stderr` is not.

    Loading a model logs from C++ too (SentencePiece's "normalizer.cc ...
    precompiled_charsmap is empty" for each vocabulary it reads). Python's
    warnings, log records and errors meanwhile go to the real stderr,
    through a stream on a duplicate of it. Nothing is silenced when the
    logs were asked for (`native_logs_shown`), or when `sys.stderr` is not
    the process's fd 2 (a test capturing it).
    """
    global _python_stderr
    try:
        real = sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError and a ValueError
        real = False
    if native_logs_shown or not real:
        yield
        return
    sys.stderr.flush()
    if _python_stderr is None:  # kept open: a handler that took `sys.stderr` meanwhile keeps writing to it
        _python_stderr = open(os.dup(2), "w", encoding=sys.stderr.encoding, errors="backslashreplace", buffering=1)
    saved, null, previous = os.dup(2), os.open(os.devnull, os.O_WRONLY), sys.stderr
    os.dup2(null, 2)
    sys.stderr = _python_stderr
    try:
        yield
    finally:
        _python_stderr.flush()
        sys.stderr = previous
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def import_tensorflow_quietly():
    """Imports TensorFlow and Keras, and finds the devices, with the C++ start-up logging silenced.

    File descriptor 2 goes to the null device only for the import and the
    device listing: what TensorFlow's C++ code writes then is dropped,
    whatever it is. An exception raised meanwhile still propagates, after
    stderr is back.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        import tensorflow as tf

        tf.config.list_physical_devices()  # loads the GPU platform, which logs "failed call to cuInit" without one
        import keras  # noqa: F401  (registers the package's serializable classes: `keras_transformer`)
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)
