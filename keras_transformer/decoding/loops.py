"""The search loops: greedy and beam search as one `tf.while_loop` each (§6.1).

Beam search keeps K alive and K finished hypotheses per sentence and ranks
finished ones with a length penalty (`length_penalty`: GNMT's, §6.1, by
default, or fairseq's "average"; see `beam_search`). Each loop
calls a step function (`keras_transformer.decoding.steps`) for the logits of
the next position.
"""

import tensorflow as tf

from keras_transformer.decoding.defaults import DEFAULT_LENGTH_PENALTY, NEG_INF, check_length_penalty
from keras_transformer.decoding.encoding import encode_by_length
from keras_transformer.decoding.prefixes import checked_prefix, prefix_token_at
from keras_transformer.decoding.steps import make_step_fn
from keras_transformer.decoding.tokens import forbid_tokens, output_limits, top_allowed_tokens, write_position
from keras_transformer.special_ids import PAD_ID

# Finished sentences leave the batch once they are at least 1 / DROP_FINISHED_SHARE of it.
DROP_FINISHED_SHARE = 8


def length_penalty(length, alpha, kind=DEFAULT_LENGTH_PENALTY):
    """The divisor of a finished hypothesis's log-probability, float32 (§6.1's "length penalty alpha").

    Args:
        length: the output length |Y|, end token included (int or int tensor).
        alpha: the exponent; 0 gives 1 (raw log-probabilities).
        kind: "gnmt": `((5 + length) / 6) ** alpha` (Wu et al., 2016, eq. 14, the penalty §6.1 cites);
            "average": `length ** alpha` (fairseq's `--lenpen`, CTranslate2's `length_penalty`).

    Returns:
        float32, the shape of `length`.
    """
    length = tf.cast(length, tf.float32)
    base = (5.0 + length) / 6.0 if check_length_penalty(kind) == "gnmt" else length
    return tf.pow(base, tf.cast(alpha, tf.float32))


def greedy_search_graph(
    model,
    source_ids,
    max_length,
    min_length,
    bos_id,
    eos_id,
    use_cache,
    max_extra_length,
    choose_tokens=None,
    no_repeat_ngram_size=0,
    target_prefix=None,
):
    """Untrimmed greedy search: `(token_ids [B, L], scores [B])`.

    `choose_tokens(log_probs [B, V], i) -> tokens [B]` picks each step's
    token (default: the most probable; sampling passes a random draw). The
    score adds the chosen tokens' log-probabilities. A token that would repeat
    an n-gram of its sentence's output (`no_repeat_ngram_size` > 0) is not
    chosen (`tokens.blocked_ngram_tokens`). Where `target_prefix [B, P]`
    forces a token (`decoding.prefixes`), that token is taken, scored with
    its log-probability. In a plain graph,
    finished sentences leave the batch, as in `beam_search_graph`, except
    when sampling: a seeded draw depends on the sentence's row in the batch,
    so the batch keeps its rows and a seed gives a batch the same samples.
    """
    batch_size = tf.shape(source_ids)[0]
    buffer_length, limits = output_limits(model, source_ids, max_length, max_extra_length)  # L, [B]
    memory = encode_by_length(model, source_ids)  # [B, S, D]
    step = make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache)
    rows = dict(
        token_ids=tf.zeros([batch_size, buffer_length], tf.int32),  # [B, L]
        scores=tf.zeros([batch_size], tf.float32),  # [B]
        done=tf.zeros([batch_size], tf.bool),  # [B]
        limits=limits,  # [B]
        sentence=tf.range(batch_size),  # [B]: the row of the sentence in the input and results
    )
    if target_prefix is not None:
        rows["prefix"] = checked_prefix(target_prefix, limits)  # [B, P + 1]
    results = {"token_ids": rows["token_ids"], "scores": rows["scores"]}
    drops_finished = step.can_select and choose_tokens is None
    options = dict(min_length=min_length, eos_id=eos_id, no_repeat_ngram_size=no_repeat_ngram_size)

    def body(i, rows, results, model_state):
        history = rows["token_ids"][:, None]  # [B, 1, L]
        logits, model_state = step(i, history, model_state)  # [B, 1, V]
        forced = prefix_token_at(rows["prefix"], i) if target_prefix is not None else None  # [B]
        if choose_tokens is None:
            token_log_probs, tokens = top_allowed_tokens(
                logits, 1, i, history=history, forced=None if forced is None else forced[:, None], **options
            )  # [B, 1, 1]
            tokens, token_log_probs = tokens[:, 0, 0], token_log_probs[:, 0, 0]  # [B]
        else:
            tokens, token_log_probs = _sampled_tokens(logits, i, rows["token_ids"], choose_tokens, forced, **options)
        # Finished sentences only append padding and keep their score.
        done = rows["done"]
        tokens = tf.where(done, PAD_ID, tokens)
        rows = dict(
            rows,
            scores=rows["scores"] + tf.where(done, 0.0, token_log_probs),
            token_ids=write_position(rows["token_ids"], i, tokens),
            done=done | tf.equal(tokens, eos_id) | (i + 1 >= rows["limits"]),
        )
        if drops_finished:
            rows, results, model_state = _drop_finished(step, rows, results, model_state)
        return i + 1, rows, results, model_state

    def cond(i, rows, results, model_state):
        return (i < buffer_length) & tf.logical_not(tf.reduce_all(rows["done"]))

    results = _search_loop(step, cond, body, rows, results, drops_finished)
    return results["token_ids"], results["scores"]


def _sampled_tokens(logits, i, token_ids, choose_tokens, forced, min_length, eos_id, no_repeat_ngram_size):
    """`(tokens, log_probs [B])`: `choose_tokens`' draw from the allowed tokens of `logits [B, 1, V]`.

    `forced [B]`: the tokens target prefixes force (0: none), taken instead
    of the draw, with their log-probability under the model; None: none.
    """
    log_probs = tf.nn.log_softmax(logits[:, 0])
    # -inf, not NEG_INF: the temperature divides these, and -1e9 / 1e9 would be a likely token.
    allowed = forbid_tokens(log_probs, i, min_length, eos_id, -float("inf"), token_ids, no_repeat_ngram_size)
    tokens = choose_tokens(allowed, i)
    if forced is None:
        return tokens, tf.gather(allowed, tokens, batch_dims=1)
    # A drawn token is an allowed one, whose log-probability `allowed` holds unchanged.
    tokens = tf.where(tf.not_equal(forced, PAD_ID), forced, tokens)
    return tokens, tf.gather(log_probs, tokens, batch_dims=1)


def _search_loop(step, cond, body, rows, results, shrinks, first_body=None):
    """Runs `body(i, rows, results, model_state)` while `cond`; returns `results` with every row stored.

    `rows` holds one row per sentence still in the batch (its batch axis
    shrinks if `shrinks`: `body` drops finished sentences), `results` one per
    input sentence. `first_body`, if given, runs step 0 (if `cond` holds)
    before the loop, in place of `body`.
    """
    loop_vars = (tf.constant(0, tf.int32), rows, results, step.initial_state)
    vary_batch = (lambda t: tf.TensorShape([None] + t.shape.as_list()[1:])) if shrinks else (lambda t: t.shape)
    invariants = (
        tf.TensorShape([]),
        tf.nest.map_structure(vary_batch, rows),
        tf.nest.map_structure(lambda t: t.shape, results),
        step.state_shape_invariants,
    )
    if first_body is not None:
        loop_vars = tf.cond(cond(*loop_vars), lambda: first_body(*loop_vars), lambda: loop_vars)
    _, rows, results, _ = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    if not shrinks:  # every sentence kept its row
        return {name: rows[name] for name in results}
    return _store_finished(results, rows, tf.range(tf.shape(rows["done"])[0]))


# ----------------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------------


def beam_search_graph(
    model,
    source_ids,
    beam_size,
    alpha,
    max_length,
    min_length,
    bos_id,
    eos_id,
    return_all,
    use_cache,
    max_extra_length,
    early_stopping,
    no_repeat_ngram_size=0,
    target_prefix=None,
    length_penalty=DEFAULT_LENGTH_PENALTY,
):
    """Untrimmed beam search: finished `(token_ids [B, K, L], scores [B, K])`, best first.

    In a plain graph, sentences whose search is over leave the batch (their
    results are stored, their rows and cache dropped), so a batch costs what
    its unfinished sentences cost rather than running at full size until its
    slowest sentence ends. Each sentence's computation is the same either way.
    `target_prefix [B, P]`: the tokens each sentence's outputs start with
    (`decoding.prefixes`).
    """
    k = beam_size
    batch_size = tf.shape(source_ids)[0]
    buffer_length, limits = output_limits(model, source_ids, max_length, max_extra_length)  # L, [B]

    # Encode once; the K beams of a sentence share its memory.
    memory = encode_by_length(model, source_ids)  # [B, S, D]
    step = make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache, beam_size=k)
    beams = _initial_beams(batch_size, k, buffer_length, limits, alpha, length_penalty)
    if target_prefix is not None:
        beams["prefix"] = checked_prefix(target_prefix, limits)  # [B, P + 1]
    results = {"finished_ids": beams["finished_ids"], "finished_scores": beams["finished_scores"]}
    options = dict(
        k=k,
        alpha=alpha,
        penalty_kind=length_penalty,
        min_length=min_length,
        eos_id=eos_id,
        early_stopping=early_stopping,
        return_all=return_all,
        no_repeat_ngram_size=no_repeat_ngram_size,
    )

    def body(i, beams, results, model_state, first=False):
        beams, model_state = _beam_step(step, i, beams, model_state, first=first, **options)
        if step.can_select:  # a plain graph: finished sentences leave the batch
            beams, results, model_state = _drop_finished(step, beams, results, model_state)
        return i + 1, beams, results, model_state

    def cond(i, beams, results, model_state):
        return (i < buffer_length) & tf.logical_not(tf.reduce_all(beams["done"]))

    # Step 0 computes one hypothesis per sentence (`first`), outside the loop.
    first_body = (lambda *loop_vars: body(*loop_vars, first=True)) if getattr(step, "has_first", False) else None
    # A sentence ends at its length limit at the latest, where the whole new
    # beam finishes: every sentence has finished hypotheses.
    results = _search_loop(step, cond, body, beams, results, step.can_select, first_body)
    return results["finished_ids"], results["finished_scores"]


def _beam_step(
    step,
    i,
    beams,
    model_state,
    k,
    alpha,
    penalty_kind,
    min_length,
    eos_id,
    early_stopping,
    return_all,
    no_repeat_ngram_size,
    first=False,
):
    """Steps 1-5 of `beam_search` at output position i, for the sentences in `beams` (`first`: i is 0).

    With `no_repeat_ngram_size`, each alive hypothesis's candidates leave out the tokens that would repeat one of
    its own n-grams (`tokens.blocked_ngram_tokens`), whatever the other hypotheses hold. With target prefixes
    (`beams["prefix"]`), a hypothesis has one candidate while its sentence's prefix forces a token.
    """
    length = i + 1  # output length after this step
    alive_ids, alive_log_probs, limits = beams["alive_ids"], beams["alive_log_probs"], beams["limits"]
    batch_size = tf.shape(alive_log_probs)[0]

    # 1. Extend every alive hypothesis by every token. Only the best 2K
    #    tokens of each can be among the 2K best candidates of its
    #    sentence, so only those are kept.
    #    Hypotheses that can no longer change the result get no candidates
    #    (`_can_change_result`): a plain graph does not project them.
    rows = None
    if step.can_select and early_stopping == "exact" and not first:
        rows = _can_change_result(beams, return_all)
    forced = None
    if "prefix" in beams:  # the sentence's forced token, for each of its hypotheses
        forced = tf.broadcast_to(prefix_token_at(beams["prefix"], i)[:, None], tf.shape(alive_log_probs))  # [B, K]
    token_log_probs, tokens, model_state = step.top_tokens(
        i, alive_ids, model_state, 2 * k, min_length, eos_id, first, rows, no_repeat_ngram_size, forced
    )  # [B, K, C]
    candidate_log_probs = alive_log_probs[:, :, None] + token_log_probs  # [B, K, C]
    per_beam = tf.shape(tokens)[-1]  # C = 2K, or V if smaller

    # 2. The 2K best candidates: at most K end with EOS, so K can go on.
    top_log_probs, top_flat = tf.math.top_k(
        tf.reshape(candidate_log_probs, [batch_size, k * per_beam]), k=2 * k
    )  # [B, 2K], sorted best first
    top_beams = top_flat // per_beam  # [B, 2K]: the alive hypothesis each extends
    top_tokens = tf.gather(tf.reshape(tokens, [batch_size, k * per_beam]), top_flat, batch_dims=1)  # [B, 2K]
    top_ids = tf.gather(alive_ids, top_beams, batch_dims=1)  # [B, 2K, L]
    top_ids = write_position(top_ids, i, top_tokens)
    ends = tf.equal(top_tokens, eos_id) | (length >= limits)[:, None]  # [B, 2K]

    # 3. Finished: the candidates that end and rank in the top K (the new
    #    beam), scored with the length penalty; keep the K best overall.
    in_beam = tf.range(2 * k) < k  # [2K]
    new_scores = top_log_probs / length_penalty(length, alpha, penalty_kind)  # [B, 2K]
    # A candidate of a placeholder hypothesis (`_initial_beams`) is none: at the length limit right after a
    # forced prefix, it would otherwise finish as padding.
    real = top_log_probs > NEG_INF / 2  # [B, 2K]
    new_scores = tf.where(ends & in_beam & real, new_scores, NEG_INF)
    merged_scores = tf.concat([beams["finished_scores"], new_scores], axis=1)  # [B, 3K]
    merged_ids = tf.concat([beams["finished_ids"], top_ids], axis=1)  # [B, 3K, L]
    new_finished_scores, keep = tf.math.top_k(merged_scores, k=k)  # [B, K]
    new_finished_ids = tf.gather(merged_ids, keep, batch_dims=1)  # [B, K, L]

    # 4. Alive: the K best candidates that do not end.
    new_alive_log_probs, keep = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), k=k)  # [B, K]
    new_alive_ids = tf.gather(top_ids, keep, batch_dims=1)  # [B, K, L]
    parents = tf.gather(top_beams, keep, batch_dims=1)  # [B, K]
    model_state = step.reorder(model_state, parents)

    # 5. Freeze sentences that were already done; mark the newly done ones.
    frozen = beams["done"][:, None]  # [B, 1]
    updated = dict(
        beams,
        alive_ids=tf.where(frozen[..., None], alive_ids, new_alive_ids),
        alive_log_probs=tf.where(frozen, alive_log_probs, new_alive_log_probs),
        finished_ids=tf.where(frozen[..., None], beams["finished_ids"], new_finished_ids),
        finished_scores=tf.where(frozen, beams["finished_scores"], new_finished_scores),
    )
    cannot_improve = _cannot_improve(
        updated["alive_log_probs"], updated["finished_scores"], beams["max_penalty"], early_stopping, return_all
    )
    updated["done"] = beams["done"] | (length >= limits) | cannot_improve
    return updated, model_state


def _drop_finished(step, rows, results, model_state):
    """Stores the finished sentences' results and removes them from the batch and the cache.

    Dropping copies the state of the sentences that stay (as one step's cache
    append does), so it waits until a fair share of the batch is done.
    """
    done = rows["done"]
    finished = tf.reduce_sum(tf.cast(done, tf.int32))

    def drop():
        stay = tf.where(tf.logical_not(done))[:, 0]
        stored = _store_finished(results, rows, tf.where(done)[:, 0])
        return tf.nest.map_structure(lambda t: tf.gather(t, stay), rows), stored, step.select(model_state, stay)

    def keep():
        return rows, results, model_state

    worth_it = (finished > 0) & (finished * DROP_FINISHED_SHARE >= tf.size(done))
    return tf.cond(worth_it, drop, keep)


def _store_finished(results, rows, which):
    """`results` with `rows[name]` of the batch rows `which` written at their sentences' rows, for each name."""
    sentences = tf.gather(rows["sentence"], which)[:, None]  # [W, 1]
    return {
        name: tf.tensor_scatter_nd_update(tensor, sentences, tf.gather(rows[name], which))
        for name, tensor in results.items()
    }


def _can_change_result(beams, return_all):
    """`[B, K]`: the alive hypotheses of unfinished sentences whose continuations can still change the result.

    With "exact" stopping, hypothesis k can reach at most the score
    `alive_log_probs[k] / max_penalty` (`_cannot_improve`). If that is no
    better than the finished score it would have to beat (the best; with
    `return_all` the K-th), none of its continuations can enter the result;
    and since every candidate ranked above a continuation of it has a higher
    log-probability, it never takes a candidate's place in the new beam
    either: leaving it without candidates changes no result. The finished
    scores only rise, so such a hypothesis stays out.
    """
    finished = beams["finished_scores"]
    target = finished[:, -1] if return_all else finished[:, 0]
    bound = beams["alive_log_probs"] / beams["max_penalty"][:, None]  # [B, K]
    return (bound > target[:, None]) & tf.logical_not(beams["done"])[:, None]


def _cannot_improve(alive_log_probs, finished_scores, max_penalty, early_stopping, return_all):
    """Whether each sentence's search is over `[B]` (step 5 of `beam_search`)."""
    if early_stopping == "k_finished":
        # The finished set is sorted: the K-th is real once K have finished.
        return finished_scores[:, -1] > NEG_INF / 2
    # Alive hypotheses are sorted: the first one has the best log P, and
    # dividing it by the penalty at the length limit bounds what any can reach.
    best_alive_bound = alive_log_probs[:, 0] / max_penalty
    target = finished_scores[:, -1] if return_all else finished_scores[:, 0]
    return target >= best_alive_bound


def _initial_beams(batch_size, k, buffer_length, limits, alpha, penalty_kind):
    """Each sentence's search before step 0 (a dict of `[B, ...]` tensors, one row per sentence)."""
    # Only beam 0 starts alive: the other K-1 copies of the start token would
    # otherwise fill the first beam with duplicates.
    initial_log_probs = tf.tile(tf.constant([[0.0] + [NEG_INF] * (k - 1)], tf.float32), [batch_size, 1])  # [B, K]
    return dict(
        alive_ids=tf.zeros([batch_size, k, buffer_length], tf.int32),  # [B, K, L]
        alive_log_probs=initial_log_probs,  # [B, K]
        finished_ids=tf.zeros([batch_size, k, buffer_length], tf.int32),  # [B, K, L]
        finished_scores=tf.fill([batch_size, k], NEG_INF),  # [B, K]
        done=tf.zeros([batch_size], tf.bool),  # [B]
        limits=limits,  # [B]: maximum output length
        # Best score a sentence's alive hypotheses could still reach is divided by this.
        max_penalty=length_penalty(limits, alpha, penalty_kind),  # [B]
        sentence=tf.range(batch_size),  # [B]: the row of the sentence in the input and results
    )
