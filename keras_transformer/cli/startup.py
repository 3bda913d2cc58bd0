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

import os
import sys

from keras_transformer import __version__  # the package loads its model lazily: no TensorFlow here

VERSION = __version__
TF_LOGS_ENVIRONMENT = "KERAS_TRANSFORMER_TF_LOGS"
TF_LOGS_FLAG = "--verbose-tf"
TF_LOGS_HELP = (
    f"TensorFlow's start-up logging is silenced; --verbose-tf (before COMMAND) or {TF_LOGS_ENVIRONMENT}=1 shows it."
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
