"""The text files the commands read (sentences, references): one reader, one kind of error."""

import sys

STDIN_NAME = "<stdin>"


def read_lines(path, command):
    """The lines of a UTF-8 text file (plain or gzip) as `data.text.read_text_lines` reads them.

    Lines are split on LF only (so parallel files stay aligned whatever other
    line breaks they hold) and their whitespace is normalized. A missing file
    or invalid UTF-8 ends the command with a message that names the file (and
    the line) instead of a traceback, or of bytes silently replaced.

    Args:
        path: the file.
        command: the command's name, for the message.
    """
    import tensorflow as tf

    from keras_transformer.data.text import read_text_lines

    try:
        return read_text_lines(path)
    except tf.errors.NotFoundError:
        raise SystemExit(f"{command}: no such file: {path}") from None
    except (OSError, ValueError, tf.errors.OpError) as error:
        raise SystemExit(f"{command}: {error}") from None


def read_stdin_lines(command):
    """The lines of standard input, read and normalized as `read_lines` reads a file's.

    Its bytes are decoded here, not by Python's text layer (whose encoding
    follows the locale), so an invalid byte ends the command with a message
    naming "<stdin>" and the line.
    """
    from keras_transformer.data.text import decode_text_lines

    try:
        return decode_text_lines(sys.stdin.buffer.read(), STDIN_NAME)
    except (OSError, ValueError) as error:  # invalid UTF-8, a broken gzip stream
        raise SystemExit(f"{command}: {error}") from None
