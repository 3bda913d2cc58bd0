"""Target prefixes: each output starts with given tokens, and the search continues them.

Not in the paper (which decodes freely, §6.1): CTranslate2's `target_prefix`,
fairseq's `--prefix-size` and Sockeye's `target_prefix`, for interactive
translation (a translator types the beginning, the model completes it),
terminology and autocompletion. Prefixes are an int32 `[B, P]` tensor of
output token ids, 0-padded (a 0 forces nothing at its position); a sentence
with no prefix has a row of zeros. At output position t < P, every
hypothesis of sentence b has `prefix[b, t]` as its only candidate
(`tokens.force_tokens`), scored with its log-probability under the model, so
a score stays log P of the whole output, prefix included (`score_outputs`).
In beam search the K hypotheses of a sentence then hold the same prefix:
only the one started at step 0 is alive (`loops._initial_beams`), and each
of its forced steps has one candidate, so the beam opens up after the prefix.

Without prefixes (None) none of this is in the graph: the searches hold the
same ops as before and give the same outputs.
"""

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.decoding.defaults import refuse_bad_ids
from keras_transformer.errors import ParameterError
from keras_transformer.special_ids import PAD_ID


def padded_prefix(target_prefix):
    """int `[B, P]` target prefixes -> int32 `[B, P + 1]`, with one more padding column (`prefix_token_at`)."""
    return tf.pad(tf.cast(target_prefix, tf.int32), [[0, 0], [0, 1]])


def prefix_token_at(prefix, i):
    """The token each row's prefix forces at output position i, `[B]` (0: none).

    `prefix [B, P + 1]` is `padded_prefix`'s: every position from P on reads
    its padding column, with a plain gather (XLA-friendly).
    """
    return tf.gather(prefix, tf.minimum(i, tf.shape(prefix)[1] - 1), axis=1)


def prefix_lengths(prefix):
    """The length of each row of `prefix [B, P]` (a 0-padded or `padded_prefix`): its last non-pad position + 1.

    Example:
        >>> prefix_lengths(tf.constant([[5, 6, 0], [0, 7, 0], [0, 0, 0]])).numpy().tolist()
        [2, 2, 0]
    """
    prefix = tf.pad(prefix, [[0, 0], [0, 1]])  # a column of padding: a prefix of width 0 has length 0
    positions = tf.range(tf.shape(prefix)[1])[None] + 1  # [1, P + 1]
    return tf.reduce_max(tf.where(tf.not_equal(prefix, PAD_ID), positions, 0), axis=1)


def checked_prefix(target_prefix, limits):
    """`padded_prefix(target_prefix)`, checked in the graph against the batch and the output limits `[B]`.

    One row per sentence, and no prefix longer than its sentence's maximum
    output length (`tokens.output_limits`): else an InvalidArgumentError
    naming `target_prefix`. Under XLA, which ignores assertions, a longer
    prefix is cut at the limit, where the search ends.
    """
    prefix = padded_prefix(target_prefix)
    if compat.graph_is_compiled_by_xla():
        return prefix
    rows = tf.debugging.assert_equal(
        tf.shape(prefix)[0],
        tf.shape(limits)[0],
        message="target_prefix: needs one row per sentence of source_ids",
    )
    with tf.control_dependencies([rows]):
        fits = tf.debugging.assert_less_equal(
            prefix_lengths(prefix),
            limits,
            message="target_prefix: a prefix is longer than its sentence's maximum output length",
        )
    with tf.control_dependencies([fits]):
        return tf.identity(prefix)


def check_target_prefix(target_prefix, limits, eos_id, vocab_size=None):
    """Refuses eager `target_prefix [B, P]` with a `ParameterError` (one line) before any decoding.

    Args:
        target_prefix: the prefixes (array-like or eager tensor), 0-padded.
        limits: int `[B]`, each sentence's maximum output length.
        eos_id: the end token, which a prefix may not hold: it would end
            the output inside its prefix.
        vocab_size: the model's, which every id must be below (None: unchecked).
    """
    prefix = tf.convert_to_tensor(target_prefix)
    if not prefix.dtype.is_integer or prefix.shape.rank != 2:
        raise ParameterError(
            "target_prefix", f"must be an integer [batch, length] tensor, got {prefix.dtype.name} {prefix.shape}."
        )
    prefix = prefix.numpy()
    limits = tf.convert_to_tensor(limits).numpy()
    if prefix.shape[0] != limits.shape[0]:
        raise ParameterError("target_prefix", f"has {prefix.shape[0]} rows for {limits.shape[0]} sentences.")
    bad = (prefix < 0) | (prefix == eos_id) | ((prefix >= vocab_size) if vocab_size is not None else False)
    allowed = f"ids in [0, {vocab_size})" if vocab_size is not None else "ids >= 0"
    refuse_bad_ids("target_prefix", prefix, bad, f"; allowed: {allowed} (0: none), not the end token {eos_id}.")
    lengths = prefix_lengths(tf.constant(prefix)).numpy()
    for row, (length, limit) in enumerate(zip(lengths, limits)):
        if length > limit:
            raise ParameterError(
                "target_prefix",
                f"row {row}: {length} tokens, longer than its sentence's maximum output length {limit}.",
            )
