"""How the translators read a sentence: normalized as the training data was read, and its subwords counted.

`Translator` (and so a served SavedModel) and `SavedModelTranslator` both
read sentences this way, so a line of `translate --input FILE` and a request
to a server are translated alike.
"""

import numpy as np
import tensorflow as tf

from keras_transformer.data.text import normalize_in_graph


def cut_to_bytes(sentence, max_bytes):
    """`sentence` (str) cut to its first `max_bytes` UTF-8 bytes, a character cut in two dropped, as
    `Translator.bounded` cuts it in the graph; None or a shorter sentence: the sentence itself.

    Example:
        >>> cut_to_bytes("für", 2), cut_to_bytes("für", 3), cut_to_bytes("für", None)
        ('f', 'fü', 'für')
    """
    data = sentence.encode("utf-8", "surrogateescape")
    if not max_bytes or len(data) <= max_bytes:
        return sentence
    return data[:max_bytes].decode("utf-8", "ignore")


def normalized(sentences):
    """Sentences `[N]` as the training data was read: valid UTF-8 (U+FFFD for invalid bytes), no leading
    byte-order mark, runs of spaces and tabs as one space, no whitespace at either end (Unicode's too)."""
    sentences = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD)
    return normalize_in_graph(tf.strings.regex_replace(sentences, "^\ufeff", ""))


def count_source_pieces(tokenizer, sentences):
    """The subword count of each of `sentences` (list of str), normalized as the translators read them.

    Example:
        >>> from keras_transformer.data.corpora import read_lines
        >>> from keras_transformer.data.tokenizer import train_tokenizer
        >>> import tempfile
        >>> tokenizer = train_tokenizer(read_lines("train", "en")[:500], tempfile.mkdtemp() + "/spm", vocab_size=400)
        >>> counts = count_source_pieces(tokenizer, ["A dog.", "  ", "A dog runs on the beach."])
        >>> int(counts[1]), bool(counts[2] > counts[0] > 0)
        (0, True)
    """
    if not sentences:
        return np.zeros([0], np.int64)
    return tokenizer.tokenize(normalized(tf.constant(sentences, tf.string))).row_lengths().numpy()
