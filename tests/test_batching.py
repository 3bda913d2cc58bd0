"""Token-budget batches (keras_transformer.data.batching): what reaches the tokenizer."""

import re

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


def _trained_tokenizer(tmp_path, **options):
    from keras_transformer.data.tokenizer import train_tokenizer

    texts = [f"a small sentence number {i} about a dog" for i in range(200)]
    return train_tokenizer(texts, tmp_path / "spm", 300 if options.get("byte_fallback", True) else 40, **options)


def test_the_byte_bound_is_the_models_longest_piece_and_none_without_one(tmp_path):
    """4 bytes a character of the longest piece; no bound when one token may stand for any number of
    characters (a run of unknown ones without byte fallback) or a normalizer may compose them (NFKC)."""
    tokenizer = _trained_tokenizer(tmp_path / "default")
    pieces = [tokenizer.id_to_piece(i).numpy().decode() for i in range(4, tokenizer.vocab_size)]
    longest = max(len(piece) for piece in pieces if not re.fullmatch("<0x[0-9A-F]{2}>", piece))  # bytes: 1 each
    assert tokenizer.max_bytes_per_token == 4 * longest <= data.MAX_BYTES_PER_TOKEN
    assert _trained_tokenizer(tmp_path / "unk", byte_fallback=False).max_bytes_per_token is None
    assert _trained_tokenizer(tmp_path / "nfkc", normalization_rule_name="nmt_nfkc").max_bytes_per_token is None
    assert data.max_bytes_per_token(WordTokenizer()) == data.MAX_BYTES_PER_TOKEN  # a tokenizer that does not say


def test_a_pair_that_fits_in_tokens_is_kept_however_many_bytes_it_has(tmp_path):
    """Without byte fallback 300 unknown characters (600 bytes) are one token: the pair fits in 8 tokens,
    and both the batches and the epoch's count keep it."""
    tokenizer = _trained_tokenizer(tmp_path, byte_fallback=False)
    pairs = tf.constant(["a dog", "\u0416" * 300]), tf.constant(["a dog", "a dog"])
    assert int(tokenizer.tokenize(pairs[0][1:]).row_lengths()[0]) + 1 <= 8
    made = data.make_batches(
        tf.data.Dataset.from_tensor_slices(pairs), tokenizer, batch_tokens=16, max_length=8, shuffle=False
    )
    assert sum(int(src.shape[0]) for (src, _), _ in made) == 2
    assert training_stream.count_batches_per_epoch(pairs, tokenizer, 16, 8, 1) == 1  # 2 pairs a batch
