"""The text files the commands read (sentences, references): one reader, one kind of error."""

import os
import sys

from keras_transformer.cli.errors import CommandError, first_line

STDIN_NAME = "<stdin>"


def read_lines(path, flag):
    """The lines of a UTF-8 text file (plain or gzip) as `data.text.read_text_lines` reads them.

    Lines are split on LF only (so parallel files stay aligned whatever other
    line breaks they hold) and their whitespace is normalized. A missing file,
    a directory, an unreadable file or invalid UTF-8 is a `CommandError` that
    names the flag and the file (and the line), not a traceback, nor bytes
    silently replaced.

    Args:
        path: the file.
        flag: the flag that named it, as the user typed it (`"--src"`), for the message.

    Raises:
        CommandError: the file cannot be read as UTF-8 text.
    """
    import tensorflow as tf

    from keras_transformer.data.text import read_text_lines

    where = f"{flag} {path}"
    if os.path.isdir(path):
        raise CommandError(f"{where}: is a directory, not a file.")
    if not tf.io.gfile.exists(path):
        raise CommandError(f"{where}: no such file.")
    try:
        return read_text_lines(path)
    except (OSError, ValueError, tf.errors.OpError) as error:
        message = first_line(getattr(error, "message", error))
        # The reader's own messages start with the path ("FILE: line 2: invalid UTF-8").
        raise CommandError(f"{flag} {message}" if message.startswith(str(path)) else f"{where}: {message}") from None


def read_stdin_lines():
    """The lines of standard input, read and normalized as `read_lines` reads a file's.

    Its bytes are decoded here, not by Python's text layer (whose encoding
    follows the locale), so an invalid byte is a `CommandError` naming
    "<stdin>" and the line.
    """
    from keras_transformer.data.text import decode_text_lines

    try:
        return decode_text_lines(sys.stdin.buffer.read(), STDIN_NAME)
    except (OSError, ValueError) as error:  # invalid UTF-8, a broken gzip stream
        raise CommandError(str(error)) from None
