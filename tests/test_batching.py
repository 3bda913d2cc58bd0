"""Token-budget batches (keras_transformer.data.batching): what reaches the tokenizer."""

import numpy as np
import tensorflow as tf

from keras_transformer import data
from keras_transformer.training import stream as training_stream

LONGEST_SEEN_LIMIT = 100_000  # bytes: far above any line that fits, far below the megabyte line


class WordTokenizer:
    """A word per token (ids from a hash), that fails if a string of `LONGEST_SEEN_LIMIT` bytes reaches it."""

    def tokenize(self, strings):
        strings = tf.convert_to_tensor(strings)
        longest = tf.reduce_max(tf.concat([tf.strings.length(strings), [0]], 0))
        checked = tf.debugging.assert_less(
            longest, LONGEST_SEEN_LIMIT, message="an over-long line reached the tokenizer"
        )
        with tf.control_dependencies([checked]):
            words = tf.strings.split(tf.identity(strings))
        return tf.cast(tf.strings.to_hash_bucket_fast(words, 1000), tf.int32) + 4


def _pairs(with_long_line):
    sources = [f"a small sentence number {i}" for i in range(40)]
    targets = [f"ein kleiner Satz Nummer {i}" for i in range(40)]
    if with_long_line:
        sources.insert(17, "word " * 200_000)  # 1 MB
        targets.insert(17, "Wort")
    return tf.constant(sources), tf.constant(targets)


def test_a_megabyte_line_is_dropped_before_it_reaches_the_tokenizer():
    """It would be dropped as too long after tokenization anyway: the batches are those without it."""
    batches = {}
    for with_long_line in (False, True):
        dataset = tf.data.Dataset.from_tensor_slices(_pairs(with_long_line))
        made = data.make_batches(
            dataset, WordTokenizer(), batch_tokens=256, max_length=16, shuffle=False, num_replicas=1
        )
        batches[with_long_line] = [src.numpy().tolist() for (src, _), _ in made]
    assert batches[True] == batches[False]
    assert sum(len(batch) for batch in batches[True]) == 40


def test_the_epoch_count_leaves_the_megabyte_line_untokenized_too():
    count = training_stream.count_batches_per_epoch(_pairs(True), WordTokenizer(), 256, 16, 1)
    assert count == training_stream.count_batches_per_epoch(_pairs(False), WordTokenizer(), 256, 16, 1)


def test_the_byte_limit_rejects_only_pairs_that_cannot_fit():
    fits = data.within_byte_limit(
        tf.constant(["x" * (data.MAX_BYTES_PER_TOKEN * 8), "x" * (data.MAX_BYTES_PER_TOKEN * 8 + 1), "a"]),
        tf.constant(["b", "c", "ü" * (data.MAX_BYTES_PER_TOKEN * 4 + 1)]),  # 2 bytes a character
        max_length=8,
    )
    np.testing.assert_array_equal(fits.numpy(), [True, False, False])
