"""Forced decoding: the model's log-probability of given outputs, log P(Y | X) (§3.1's factorization).

    log P(Y | X) = sum_t log P(y_t | y_<t, X),   t = 1 .. |Y|, the end token included

One teacher-forced pass of the decoder over each output (no search), in
float32, batched. It is the score beam search reports with the length
penalty off (alpha = 0).
"""

import tensorflow as tf

from keras_transformer.special_ids import BOS_ID, PAD_ID


def score_outputs(model, source_ids, output_ids, bos_id=BOS_ID):
    """Sum of the log-probabilities of `output_ids` given `source_ids`, and the tokens counted.

    Args:
        model: a `Transformer` (or anything with `encode` and `decode`).
        source_ids: int `[B, S]`, 0-padded, as the search takes them.
        output_ids: int `[B, T]`, 0-padded, as the search returns them: each
            row the output tokens without the start token, ending with the
            end token (a row without one is scored as it stands).
        bos_id: the start token fed before the first output token.

    Returns:
        `(log_probs [B] float32, lengths [B] int32)`: log P(Y | X) summed over
        the non-padding tokens of each row, and their number.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    output_ids = tf.cast(output_ids, tf.int32)
    batch = tf.shape(output_ids)[0]
    decoder_inputs = tf.concat([tf.fill([batch, 1], bos_id), output_ids[:, :-1]], axis=1)  # shifted right
    memory = model.encode(source_ids, training=False)
    logits = model.decode(decoder_inputs, memory, source_ids, training=False)  # [B, T, V] float32
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
    token_log_probs = tf.gather(log_probs, output_ids, batch_dims=2)  # [B, T]
    real = tf.not_equal(output_ids, PAD_ID)
    return (tf.reduce_sum(tf.where(real, token_log_probs, 0.0), axis=1), tf.reduce_sum(tf.cast(real, tf.int32), axis=1))
