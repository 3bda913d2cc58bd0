"""The searches' encoder pass: sentences of similar length together, so little padding is computed.

A request's sentences are padded to its longest one. Encoded as one batch,
every padded position goes through every encoder layer: the first 500
sentences of Multi30k test2016, in the demo's 8,000-piece vocabulary, have
34 subwords at most and 14.6 on average, so 57% of the positions are padding.
Sorted by length and encoded `ENCODE_CHUNK_ROWS` sentences at a time, each
chunk cut to its own longest sentence, the encoder computes little more than
the real tokens (CTranslate2 sorts its input by length for the same reason).
"""

import tensorflow as tf

from keras_transformer.compat import graph_is_compiled_by_xla
from keras_transformer.special_ids import PAD_ID

# Sentences per encoder call: enough rows for the matmuls to run at full speed.
ENCODE_CHUNK_ROWS = 64


def encode_by_length(model, source_ids, chunk_rows=None):
    """`model.encode(source_ids)` computed on length-sorted chunks: memory `[B, S, D]`.

    Each sentence's memory is the one `model.encode` gives it at its own
    positions; what its padded positions hold differs (attention masks them
    either way). A row of padding only, with no token, has no meaningful
    memory either way. Under XLA, which needs static shapes, and for models
    without a `compute_dtype` and a `config.d_model`, the batch is encoded whole.

    Args:
        model: a `Transformer` (anything with `encode`, `compute_dtype` and `config.d_model`).
        source_ids: int `[B, S]`, padded with `PAD_ID` (at the end, as the tokenizer does).
        chunk_rows: sentences per encoder call; default `ENCODE_CHUNK_ROWS`.
    """
    chunk_rows = chunk_rows or ENCODE_CHUNK_ROWS
    dtype = getattr(model, "compute_dtype", None)
    d_model = getattr(getattr(model, "config", None), "d_model", None)
    if dtype is None or d_model is None or graph_is_compiled_by_xla():
        return model.encode(source_ids, training=False)
    batch, width = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    # Each sentence's extent: its last non-pad position + 1 (its length when right-padded; a
    # sentence with padding inside or in front keeps all its tokens too).
    positions = tf.range(1, width + 1)[None, :]
    extents = tf.reduce_max(tf.where(tf.not_equal(source_ids, PAD_ID), positions, 0), axis=1)  # [B]
    order = tf.argsort(extents, stable=True)  # shortest first
    sorted_ids, sorted_extents = tf.gather(source_ids, order), tf.gather(extents, order)
    chunks = tf.maximum((batch + chunk_rows - 1) // chunk_rows, 1)  # one (empty) chunk for an empty batch

    def encode_chunk(c, memories):
        start = c * chunk_rows
        end = tf.minimum(start + chunk_rows, batch)
        # At least 1 (reduce_max([]) is the lowest int), at most the width (which may be 0).
        longest = tf.minimum(tf.maximum(tf.reduce_max(sorted_extents[start:end]), 1), width)
        memory = model.encode(sorted_ids[start:end, :longest], training=False)  # [rows, longest, D]
        memory = tf.pad(memory, [[0, 0], [0, width - longest], [0, 0]])
        return c + 1, memories.write(c, memory)

    memories = tf.TensorArray(dtype, size=chunks, infer_shape=False, element_shape=[None, None, d_model])
    _, memories = tf.while_loop(lambda c, _: c < chunks, encode_chunk, (tf.constant(0), memories))
    sorted_memory = memories.concat()  # [B, S, D] in length order
    memory = tf.gather(sorted_memory, tf.math.invert_permutation(order))
    return tf.ensure_shape(memory, source_ids.shape.concatenate([d_model]))
