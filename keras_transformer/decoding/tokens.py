"""Token-level pieces of the search: output limits, forbidden tokens, an exact fast top-k."""

import tensorflow as tf

from keras_transformer import compat
from keras_transformer.decoding.defaults import EXTRA_OUTPUT_LENGTH, NEG_INF
from keras_transformer.special_ids import PAD_ID


def output_limits(model, source_ids, max_length, max_extra_length=EXTRA_OUTPUT_LENGTH):
    """Output buffer length L (scalar) and each sentence's maximum output length `[B]`.

    None: source length + `max_extra_length` (50 in §6.1) per sentence,
    L = S + `max_extra_length` (a static value under XLA). With learned positions, L is capped by the position table.
    """
    if max_length is None:
        source_lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)
        buffer_length = tf.shape(source_ids)[1] + max_extra_length
        limits = source_lengths + max_extra_length
    else:
        buffer_length = tf.constant(max_length, tf.int32)
        limits = tf.fill([tf.shape(source_ids)[0]], max_length)
    config = getattr(model, "config", None)
    if getattr(config, "positional_encoding", None) == "learned":
        # Step i feeds position i (the start token sits at 0).
        buffer_length = tf.minimum(buffer_length, config.max_length)
    return buffer_length, tf.minimum(limits, buffer_length)


def forbid_tokens(log_probs, i, min_length, eos_id, value=NEG_INF, history=None, no_repeat_ngram_size=0):
    """Pad is never generated; the end token not before `min_length` tokens: `value` there. `[..., V]`.

    With `no_repeat_ngram_size` N > 0, neither is a token that would repeat an
    N-gram of its row of `history [..., L]` (`blocked_ngram_tokens`); should
    that and `min_length` leave no token, the end token is allowed.
    Sampling passes -inf, which no temperature scales back into reach.
    """
    token = tf.range(tf.shape(log_probs)[-1])
    forbidden = tf.equal(token, PAD_ID)
    blocked = None
    if no_repeat_ngram_size:
        blocked = blocked_ngram_tokens(history, i, no_repeat_ngram_size, tf.shape(log_probs)[-1])
        forbidden |= blocked
    if min_length > 0:
        forbidden |= tf.equal(token, eos_id) & _ends_early(i, min_length, blocked, eos_id)
    return tf.where(forbidden, tf.cast(value, log_probs.dtype), log_probs)


def blocked_ngram_tokens(token_ids, i, n, vocab_size):
    """The tokens that would repeat an n-gram of their row as output token i: bool `[..., V]`.

    N-gram blocking (`no_repeat_ngram_size`, as in fairseq, CTranslate2 and
    Hugging Face; not in the paper): a row's next token t is blocked when its
    last n - 1 tokens followed by t form an n-gram the row already holds.
    `token_ids [..., L]` holds each row's output tokens at positions < i; the
    positions from i on are not read, nor is the start token, which is not an
    output token. Every (n-1)-gram of the row is compared with its last n - 1
    tokens at once (n - 1 comparisons of `[R, L]`, no loop over the steps), and
    the token that followed each match is marked with one scatter; n = 1
    blocks every token of the row.

    Args:
        token_ids: int32 `[..., L]`, each row's output so far.
        i: the output position to fill (a scalar, int or tensor).
        n: the n-gram size, a Python int >= 1.
        vocab_size: V.

    Returns:
        bool `[..., V]`: True for the blocked tokens of each row.

    Example:
        >>> rows = tf.constant([[5, 6, 5, 0], [5, 6, 7, 0]])  # 3 tokens each, then the unwritten position 3
        >>> blocked_ngram_tokens(rows, 3, 2, 8).numpy().astype(int)  # "5 6" is in row 0: 6 may not follow 5
        array([[0, 0, 0, 0, 0, 0, 1, 0],
               [0, 0, 0, 0, 0, 0, 0, 0]])
    """
    shape = tf.shape(token_ids)
    length = shape[-1]
    rows = tf.reshape(token_ids, [-1, length])  # [R, L]
    starts = tf.range(length)  # an n-gram at positions j .. j + n - 1, all before i
    matches = tf.broadcast_to(starts <= i - n, tf.shape(rows))  # [R, L]
    for offset in range(n - 1):
        earlier = tf.gather(rows, tf.minimum(starts + offset, length - 1), axis=1)  # [R, L]
        last = tf.gather(rows, tf.maximum(i - n + 1 + offset, 0), axis=1)  # [R]: only read where a match can be
        matches &= tf.equal(earlier, last[:, None])
    followers = tf.gather(rows, tf.minimum(starts + n - 1, length - 1), axis=1)  # [R, L]
    row_index = tf.broadcast_to(tf.range(tf.shape(rows)[0])[:, None], tf.shape(rows))
    counts = tf.tensor_scatter_nd_add(
        tf.zeros(tf.stack([tf.shape(rows)[0], vocab_size]), tf.int32),
        tf.stack([row_index, followers], axis=-1),
        tf.cast(matches, tf.int32),
    )  # [R, V]
    return tf.reshape(counts > 0, tf.concat([shape[:-1], [vocab_size]], axis=0))


def _ends_early(i, min_length, blocked, eos_id):
    """Whether the end token is forbidden at step i (before `min_length`), `[..., 1]` with `blocked [..., V]`.

    Blocking never forbids the end token (no row holds it yet); but should it
    forbid every other token, the end token is allowed, so that a row always
    has a token to take.
    """
    early = i < min_length
    if blocked is None:
        return early
    token = tf.range(tf.shape(blocked)[-1])
    nothing_else = tf.reduce_all(blocked | tf.equal(token, PAD_ID) | tf.equal(token, eos_id), axis=-1, keepdims=True)
    return early & tf.logical_not(nothing_else)


def top_allowed_tokens(logits, count, i, min_length, eos_id, history=None, no_repeat_ngram_size=0, forced=None):
    """The `count` most probable allowed tokens of each row of `logits [R, K, V]`.

    Returns `(log_probs, ids)`, each `[R, K, C]` with C = min(count, V), best
    first: log P(token) = logit - logsumexp(logits), over the whole vocabulary.
    Pad is never allowed, the end token not before `min_length` tokens: the
    top `count` + (number of forbidden tokens) are taken, the forbidden ones
    masked, and the best `count` kept. Exact, with no pass over the
    vocabulary besides the top-k and one softmax.

    With `no_repeat_ngram_size` N > 0, the tokens that would repeat an N-gram
    of their hypothesis in `history [R, K, L]` (`blocked_ngram_tokens`) are
    masked in the logits before the top-k, so the top `count` are taken among
    the others; the log-probabilities stay the model's (normalized over the
    whole vocabulary, as fairseq's), and a masked token that still makes the
    top `count` (a vocabulary with fewer allowed tokens) gets `NEG_INF`. With
    N = 0 none of this is in the graph.

    `forced [R, K]` (target prefixes): a hypothesis whose entry is a token id
    (not 0) has that token as its only candidate (`force_tokens`), whatever
    `min_length` and blocking say; None: none of it is in the graph.

    bfloat16 logits (a model decoding in bfloat16) stay in bfloat16 in a plain
    graph: `strided_top_k` finds their top tokens without casting the
    `[R, K, V]` logits to float32, and the softmax behind the log-normalizer
    runs in bfloat16 (oneDNN's accumulates in float32; log-probabilities move
    by at most ~0.004 against a float32 softmax of the same logits, ~0.015
    with Eigen's, less than bfloat16's own rounding of a logit near 10).
    The log-probabilities returned are float32 either way.
    """
    vocab_size = logits.shape[-1]
    forbidden_count = 1 + int(min_length > 0)
    wanted = count + forbidden_count
    if vocab_size is not None:
        wanted, count = min(wanted, vocab_size), min(count, vocab_size)
    if not (
        logits.dtype == tf.bfloat16 and strided_blocks(vocab_size, wanted) and not compat.graph_is_compiled_by_xla()
    ):
        logits = tf.cast(logits, tf.float32)
    unmasked = logits
    blocked = None
    if no_repeat_ngram_size:
        blocked = blocked_ngram_tokens(history, i, no_repeat_ngram_size, tf.shape(logits)[-1])  # [R, K, V]
        # The normalizer of all the logits, blocked tokens included: the best allowed token may be improbable.
        log_normalizer = tf.reduce_logsumexp(tf.cast(logits, tf.float32), axis=-1, keepdims=True)  # [R, K, 1]
        logits = tf.where(blocked, tf.cast(-float("inf"), logits.dtype), logits)
    top_k = strided_top_k if logits.dtype == tf.bfloat16 else blocked_top_k
    values, ids = top_k(logits, wanted)  # [R, K, count + forbidden], best first
    values = tf.cast(values, tf.float32)
    forbidden = tf.equal(ids, PAD_ID)
    if blocked is None:
        log_normalizer = _log_normalizer(logits, values[..., :1], ids[..., :1])  # [R, K, 1]
    else:
        forbidden |= tf.gather(blocked, ids, batch_dims=2)
    if min_length > 0:
        forbidden |= tf.equal(ids, eos_id) & _ends_early(i, min_length, blocked, eos_id)
    values, keep = tf.math.top_k(tf.where(forbidden, NEG_INF, values - log_normalizer), k=count)
    ids = tf.gather(ids, keep, batch_dims=2)
    if forced is not None:
        values, ids = force_tokens(values, ids, unmasked, log_normalizer, forced)
    return values, ids


def force_tokens(log_probs, ids, logits, log_normalizer, forced):
    """The candidates `(log_probs, ids [R, K, C])` with each forced token the only one of its hypothesis.

    Target prefixes (CTranslate2's `target_prefix`, fairseq's `--prefix-size`;
    not in the paper): where `forced [R, K]` holds a token id (0: nothing
    forced), the hypothesis's first candidate becomes that token, with its
    log-probability under the model (`logits [R, K, V]` minus
    `log_normalizer [R, K, 1]`, their log-sum-exp, so not renormalized), and
    the other C - 1 get `NEG_INF` (token pad). The forced token wins over
    `min_length` and n-gram blocking. Rows with nothing forced are unchanged.
    """
    forced_log_probs = tf.cast(tf.gather(logits, forced[..., None], batch_dims=2), tf.float32) - log_normalizer
    first = tf.equal(tf.range(tf.shape(ids)[-1]), 0)  # [C]
    is_forced = tf.not_equal(forced, PAD_ID)[..., None]  # [R, K, 1]
    log_probs = tf.where(is_forced, tf.where(first, forced_log_probs, NEG_INF), log_probs)
    ids = tf.where(is_forced, tf.where(first, forced[..., None], PAD_ID), ids)
    return log_probs, ids


def top_allowed_tokens_of_rows(
    values, to_logits, rows, count, i, min_length, eos_id, history=None, no_repeat_ngram_size=0, forced=None
):
    """`top_allowed_tokens(to_logits(values), ...)` for the hypotheses where `rows [B, K]` holds only.

    `values [B, K, X]` are what `to_logits` maps to logits `[..., V]` (the
    decoder output, or the logits themselves), `history [B, K, L]` the
    hypotheses' tokens (with `no_repeat_ngram_size`), `forced [B, K]` the tokens
    target prefixes force (`force_tokens`). The other hypotheses get no
    candidates: log-probability `NEG_INF` and token pad, for all C. Only the
    selected rows are projected and searched.
    """
    batch, beams = tf.shape(rows)[0], tf.shape(rows)[1]
    which = tf.where(tf.reshape(rows, [-1]))  # [R', 1]
    picked = tf.gather_nd(tf.reshape(values, [batch * beams, tf.shape(values)[-1]]), which)  # [R', X]
    if no_repeat_ngram_size:
        history = tf.gather_nd(tf.reshape(history, [batch * beams, tf.shape(history)[-1]]), which)[:, None]
    if forced is not None:
        forced = tf.gather_nd(tf.reshape(forced, [-1]), which)[:, None]  # [R', 1]
    log_probs, ids = top_allowed_tokens(
        to_logits(picked[:, None]), count, i, min_length, eos_id, history, no_repeat_ngram_size, forced
    )  # [R', 1, C]
    shape = tf.stack([batch * beams, tf.shape(ids)[-1]])  # [B*K, C]
    log_probs = tf.tensor_scatter_nd_update(tf.fill(shape, NEG_INF), which, log_probs[:, 0])
    ids = tf.tensor_scatter_nd_update(tf.fill(shape, PAD_ID), which, ids[:, 0])
    return tf.reshape(log_probs, [batch, beams, -1]), tf.reshape(ids, [batch, beams, -1])


def _log_normalizer(logits, best_logit, best_id):
    """`logsumexp(logits)` over the last axis, from one softmax: `[R, K, 1]`.

    log P(best) = best_logit - logsumexp, so logsumexp = best_logit - log
    softmax(logits)[best]. The best token's probability is at least 1 / V, so
    it never underflows. In a plain graph one fused softmax (oneDNN's on CPU)
    replaces `tf.reduce_logsumexp`'s max, subtract, exp and sum passes over
    V; XLA fuses those passes itself, so under XLA `reduce_logsumexp` stays
    (measurements: `benchmarks/README.md`).
    """
    if compat.graph_is_compiled_by_xla():
        return tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
    best_prob = tf.gather(tf.nn.softmax(logits), best_id, batch_dims=2)  # [R, K, 1]
    return best_logit - tf.math.log(tf.cast(best_prob, tf.float32))


def blocked_top_k(x, k):
    """Exact `tf.math.top_k(x, k)` over the last axis of `x [R, K, V]`, k << V, from two small top-k's.

    The V entries are cut into blocks of about sqrt(V / k). Each of the k largest
    entries lies in a block whose maximum is at least as large, and at most k
    blocks have such a maximum: the k blocks with the largest maxima hold the
    top k. So: one max-reduction over the blocks, a top-k over the V / block
    block maxima, and a top-k over the k chosen blocks (k * block entries)
    instead of a top-k over V; the block size makes the two top-k's equal.
    """
    vocab_size = x.shape[-1]
    block = block_size(vocab_size, k)
    if block is None:
        return tf.math.top_k(x, k=k)
    rows, beams = tf.shape(x)[0], tf.shape(x)[1]
    num_blocks = vocab_size // block
    blocks = tf.reshape(x, [rows, beams, num_blocks, block])  # [R, K, NB, block]
    _, best_blocks = tf.math.top_k(tf.reduce_max(blocks, axis=-1), k=k)  # [R, K, k]
    candidates = tf.gather(blocks, best_blocks, batch_dims=2)  # [R, K, k, block]
    values, position = tf.math.top_k(tf.reshape(candidates, [rows, beams, k * block]), k=k)
    ids = tf.gather(best_blocks, position // block, batch_dims=2) * block + position % block
    return values, ids


def strided_top_k(x, k):
    """The k largest values of `x [R, K, V]` over the last axis and an index of each, for bfloat16: `(values, ids)`.

    The blocked top-k of `blocked_top_k` with strided blocks: block j holds
    entries j, j + NB, j + 2 NB, ... (NB blocks). Viewed as `[R*K, block, NB]`,
    the block maxima are one max-pooling over the middle axis, which oneDNN
    computes in bfloat16, where contiguous blocks would need a cast to
    float32 and a max-reduction. Exact in the values, as
    `tf.math.top_k`'s; among entries of equal value (frequent in bfloat16)
    it may return other indices than `tf.math.top_k`, which returns the lowest.
    Without blocks (`strided_blocks` None) it is `tf.math.top_k` in float32.
    """
    sizes = strided_blocks(x.shape[-1], k)
    if sizes is None:
        values, ids = tf.math.top_k(tf.cast(x, tf.float32), k=k)
        return tf.cast(values, x.dtype), ids
    block, num_blocks = sizes
    rows, beams = tf.shape(x)[0], tf.shape(x)[1]
    blocks = tf.reshape(x, [rows * beams, block, num_blocks])  # [R*K, block, NB]: column j is block j
    maxima = tf.nn.max_pool1d(blocks, ksize=block, strides=block, padding="VALID")[:, 0]  # [R*K, NB]
    _, best_blocks = tf.math.top_k(tf.cast(maxima, tf.float32), k=k)  # [R*K, k]
    candidates = tf.gather(blocks, best_blocks, axis=2, batch_dims=1)  # [R*K, block, k]
    values, position = tf.math.top_k(tf.cast(tf.reshape(candidates, [rows * beams, block * k]), tf.float32), k=k)
    ids = (position // k) * num_blocks + tf.gather(best_blocks, position % k, batch_dims=1)
    shape = tf.stack([rows, beams, k])
    return tf.reshape(tf.cast(values, x.dtype), shape), tf.reshape(ids, shape)


def strided_blocks(vocab_size, k):
    """`(block, num_blocks)` for `strided_top_k` (the sizes of `block_size`), or None (plain top-k)."""
    block = block_size(vocab_size, k)
    return None if block is None else (block, vocab_size // block)


def block_size(vocab_size, k):
    """A divisor of V near sqrt(V / k) leaving more than k blocks, or None (plain top-k)."""
    if vocab_size is None or vocab_size < 64 * k:
        return None
    root = (vocab_size / k) ** 0.5
    divisors = [d for d in range(int(root / 2), int(2 * root) + 1) if d > 0 and vocab_size % d == 0]
    divisors = [d for d in divisors if vocab_size // d > k]
    return min(divisors, key=lambda d: abs(d - root)) if divisors else None


def write_position(token_ids, i, tokens):
    """`token_ids[..., i] = tokens` for `token_ids [..., L]`, `tokens [...]` (XLA-friendly)."""
    at_i = tf.equal(tf.range(tf.shape(token_ids)[-1]), i)
    return tf.where(at_i, tokens[..., None], token_ids)


def trim_padding(token_ids):
    """Drops trailing columns that are padding in every row (a bounded dynamic shape under XLA)."""
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(token_ids, PAD_ID), tf.int32), axis=-1)
    return token_ids[..., : tf.reduce_max(lengths)]
