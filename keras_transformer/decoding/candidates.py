"""Steps 1-2 of beam search: each sentence's best continuations of its K hypotheses (§6.1).

Every alive hypothesis k of a sentence, with log-probability `alive[k]`, is
extended by every allowed token t: K * V candidates scored
`alive[k] + log P(t | k)`. The search keeps each sentence's best 2K.
`top_candidates` finds them without sorting the K * V scores:

* in a plain TensorFlow graph, sentence by sentence (`_sentence_candidates`):
  the blocked top-k of `tokens.strided_top_k`, over the K rows of a
  sentence at once. TensorFlow's top-k costs about 1.5 µs per row however
  short the row, so one top-k per sentence over its K rows' block maxima,
  and one over the entries of the chosen blocks, cost a quarter of a top-k
  per hypothesis;
* under XLA, or with a vocabulary too small for blocks, hypothesis by
  hypothesis (`_row_candidates`): each row's best tokens
  (`tokens.top_allowed_tokens`), then the sentence's best among them.

Both give the same candidates' scores (up to which of equal scores is
taken), tokens and hypotheses.
"""

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.decoding.defaults import NEG_INF
from keras_transformer.decoding.tokens import strided_blocks, top_allowed_tokens
from keras_transformer.special_ids import PAD_ID


def top_candidates(output, to_logits, alive_log_probs, count, i, min_length, eos_id, live=None):
    """Each sentence's `count` best candidates: `(scores, beams, tokens)`, each `[B, count]`, best first.

    Args:
        output: `[B, K, X]`, what `to_logits` maps to logits `[..., V]` (a
            decoder output, or the logits themselves with `to_logits` None).
        to_logits: projects `[R, 1, X]` rows to logits `[R, 1, V]`, or None.
        alive_log_probs: float32 `[B, K]`, each hypothesis's log-probability.
        count: candidates per sentence (2K).
        i, min_length, eos_id: the end token is forbidden while `i < min_length`;
            the pad token always.
        live: bool `[B, K]`, or None for all: only these hypotheses get
            candidates, and only their rows are projected.

    Returns:
        `scores` float32: `alive_log_probs[beam] + log P(token | beam)`;
        `beams` int32: the hypothesis each candidate extends; `tokens` int32.
    """
    to_logits = to_logits or (lambda values: values)
    batch, beams = tf.shape(output)[0], alive_log_probs.shape[1]  # K static, as the search keeps it
    if live is None:
        logits = to_logits(output)
        rows = tf.reshape(logits, [batch * beams, tf.shape(logits)[-1]])  # [B*K, V]
        which = None
    else:
        which = tf.where(tf.reshape(live, [-1]))  # [R', 1]
        picked = tf.gather_nd(tf.reshape(output, [batch * beams, tf.shape(output)[-1]]), which)  # [R', X]
        rows = to_logits(picked[:, None])[:, 0]  # [R', V]
        alive_log_probs = tf.where(live, alive_log_probs, NEG_INF)
    if rows.dtype not in (tf.float32, tf.bfloat16):  # float16: searched in float32, as `top_allowed_tokens` does
        rows = tf.cast(rows, tf.float32)
    forbidden_count = 1 + int(min_length > 0)
    sizes = strided_blocks(rows.shape[-1], count + forbidden_count * beams)
    if sizes is None or compat.graph_is_compiled_by_xla():
        return _row_candidates(rows, which, alive_log_probs, count, i, min_length, eos_id)
    return _sentence_candidates(rows, which, alive_log_probs, count, i, min_length, eos_id, sizes)


def _sentence_candidates(rows, which, alive_log_probs, count, i, min_length, eos_id, sizes):
    """`top_candidates` per sentence: the blocks of the K rows with the best maxima, then their best entries.

    Block j of a row holds its entries j, j + NB, j + 2 NB, ... (`strided_top_k`).
    A block's best candidate scores `alive[k] + max - logZ`, at least as
    much as any of its entries. Let c be one of the `count` best allowed
    candidates: a block whose maximum scores above c holds either a better
    allowed candidate (fewer than `count`) or a forbidden token (at most
    F per hypothesis, F K in all), so c's block is among the
    `count + F K` blocks with the best maxima. Only those blocks' entries
    are scored and searched.
    """
    block, num_blocks = sizes
    batch, beams = tf.shape(alive_log_probs)[0], alive_log_probs.shape[1]
    vocab_size = rows.shape[-1]
    grid = tf.reshape(rows, [-1, block, num_blocks])  # [R', block, NB]: column j is block j
    maxima = tf.cast(tf.nn.max_pool1d(grid, ksize=block, strides=block, padding="VALID")[:, 0], tf.float32)
    log_normalizer = _log_normalizer(rows, grid, maxima)  # [R']
    row_of = tf.range(tf.shape(rows)[0])  # each hypothesis's row in `rows`
    if which is not None:  # hypotheses without a row: no block maxima (their scores are NEG_INF anyway)
        size = batch * beams
        maxima = tf.tensor_scatter_nd_update(tf.fill(tf.stack([size, num_blocks]), NEG_INF), which, maxima)
        log_normalizer = tf.tensor_scatter_nd_update(tf.zeros([size]), which, log_normalizer)
        row_of = tf.tensor_scatter_nd_update(tf.zeros([size], tf.int32), which, row_of)
    log_normalizer = tf.reshape(log_normalizer, [batch, beams])
    # The same expression as the candidates' scores below, so a block's score bounds its entries' exactly.
    block_scores = alive_log_probs[..., None] + (tf.reshape(maxima, [batch, beams, num_blocks])
                                                 - log_normalizer[..., None])  # [B, K, NB]
    chosen = count + (1 + int(min_length > 0)) * beams
    _, best_blocks = tf.math.top_k(tf.reshape(block_scores, [batch, beams * num_blocks]), k=chosen)  # [B, M]
    beam, column = best_blocks // num_blocks, best_blocks % num_blocks  # [B, M]
    tokens = tf.range(block)[None, None, :] * num_blocks + column[..., None]  # [B, M, block]
    row = tf.gather(tf.reshape(row_of, [batch, beams]), beam, batch_dims=1)  # [B, M]
    values = tf.gather(tf.reshape(rows, [-1]), row[..., None] * vocab_size + tokens)  # [B, M, block]
    log_probs = tf.cast(values, tf.float32) - tf.gather(log_normalizer, beam, batch_dims=1)[..., None]
    forbidden = tf.equal(tokens, PAD_ID)
    if min_length > 0:
        forbidden |= tf.equal(tokens, eos_id) & (i < min_length)
    log_probs = tf.where(forbidden, NEG_INF, log_probs)
    scores = tf.gather(alive_log_probs, beam, batch_dims=1)[..., None] + log_probs  # [B, M, block]
    top_scores, position = tf.math.top_k(tf.reshape(scores, [batch, chosen * block]), k=count)  # [B, count]
    top_beams = tf.gather(beam, position // block, batch_dims=1)
    top_tokens = tf.gather(tf.reshape(tokens, [batch, chosen * block]), position, batch_dims=1)
    return top_scores, top_beams, top_tokens


def _log_normalizer(rows, grid, maxima):
    """`logsumexp` of each row of `rows [R, V]` from one softmax, as `tokens.top_allowed_tokens` computes it: `[R]`.

    log P(best) = best logit - logsumexp, and the best logit's probability
    is the largest in the block that holds it (`grid [R, block, NB]`'s
    column with the largest of `maxima [R, NB]`).
    """
    best_block = tf.argmax(maxima, axis=-1, output_type=tf.int32)  # [R]
    probs = tf.reshape(tf.nn.softmax(rows), tf.shape(grid))  # [R, block, NB]
    best_prob = tf.reduce_max(tf.gather(probs, best_block, axis=2, batch_dims=1), axis=-1)  # [R]
    return tf.reduce_max(maxima, axis=-1) - tf.math.log(tf.cast(best_prob, tf.float32))


def _row_candidates(rows, which, alive_log_probs, count, i, min_length, eos_id):
    """`top_candidates` hypothesis by hypothesis: each row's `count` best tokens, then the sentence's best."""
    batch, beams = tf.shape(alive_log_probs)[0], alive_log_probs.shape[1]
    log_probs, ids = top_allowed_tokens(rows[:, None], count, i, min_length, eos_id)  # [R', 1, C]
    per_beam = tf.shape(ids)[-1]  # C = count, or V if smaller
    if which is not None:  # hypotheses without a row get no candidates: NEG_INF, the pad token
        shape = tf.stack([batch * beams, per_beam])
        log_probs = tf.tensor_scatter_nd_update(tf.fill(shape, NEG_INF), which, log_probs[:, 0])
        ids = tf.tensor_scatter_nd_update(tf.fill(shape, PAD_ID), which, ids[:, 0])
    candidates = alive_log_probs[:, :, None] + tf.reshape(log_probs, [batch, beams, per_beam])  # [B, K, C]
    # A vocabulary smaller than `count` with one hypothesis (step 0) has fewer candidates: the rest are none.
    available = beams * min(count, rows.shape[-1] or count)
    top_scores, top_flat = tf.math.top_k(tf.reshape(candidates, [batch, beams * per_beam]), k=min(count, available))
    top_tokens = tf.gather(tf.reshape(ids, [batch, beams * per_beam]), top_flat, batch_dims=1)
    top_beams = top_flat // per_beam
    if available < count:
        missing = [[0, 0], [0, count - available]]
        top_scores = tf.pad(top_scores, missing, constant_values=NEG_INF)
        top_beams, top_tokens = tf.pad(top_beams, missing), tf.pad(top_tokens, missing, constant_values=PAD_ID)
    return top_scores, top_beams, top_tokens
