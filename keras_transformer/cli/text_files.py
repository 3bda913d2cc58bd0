"""The text files the commands read (sentences, references): one reader, one kind of error."""


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
