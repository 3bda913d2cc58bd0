"""How the translators read a sentence: checked, normalized as the training data was read, its subwords counted.

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


def checked_request(inputs, max_batch_size, target_prefixes=None):
    """`inputs`, once it is known to be a vector of at most `max_batch_size` sentences (with as many prefixes).

    A signature called with a scalar or a matrix still runs the graph
    (its `[None]` shape is not enforced when the graph is fed), so the
    rank is checked at run time, before anything else reads the inputs.
    """
    inputs = tf.ensure_shape(inputs, [None], name="inputs_must_be_a_vector_of_sentences")
    checks = [
        tf.debugging.assert_less_equal(
            tf.size(inputs),
            max_batch_size,
            message=f"keras_transformer: at most {max_batch_size} sentences per request (inputs [N], N <= "
            f"{max_batch_size}); split the batch",
        )
    ]
    if target_prefixes is not None:
        target_prefixes = tf.ensure_shape(target_prefixes, [None], name="target_prefixes_must_be_a_vector")
        checks.append(
            tf.debugging.assert_equal(
                tf.size(target_prefixes),
                tf.size(inputs),
                message="keras_transformer: one target prefix per input (target_prefixes [N], inputs [N]; "
                "an empty string for none)",
            )
        )
    with tf.control_dependencies(checks):
        return tf.identity(inputs)
