"""Greedy and beam search decoding (Vaswani et al., 2017, §6.1).

    "we used beam search with a beam size of 4 and length penalty alpha = 0.6
    [...] We set the maximum output length during inference to input length
    + 50, but terminate early when possible."  (§6.1)

The length penalty is GNMT's (Wu et al., 2016, "Google's Neural Machine
Translation System", §7, eq. 14):

    score(Y) = log P(Y | X) / lp(Y),    lp(Y) = ((5 + |Y|) / 6) ** alpha

where |Y| counts the generated tokens, the end token included. (GNMT's
coverage penalty is not used, as in the paper's tensor2tensor setup.)

Public API:

- `greedy_search(model, source_ids, ...)` -> `(token_ids [B, L], scores [B])`
- `beam_search(model, source_ids, ...)` -> `(token_ids [B, L], scores [B])`,
  or `([B, K, L], [B, K])` best first with `return_all=True`
- `make_decode_fn(model, method, jit_compile, **options)`: a `tf.function`
  over int32 `source_ids [None, None]`, ready for a SavedModel.
- `length_penalty(length, alpha)`.

Everything runs as one TensorFlow graph: a `tf.while_loop` (whose loop
variables keep a fixed shape under XLA), so the search can be exported in a
SavedModel and compiled with XLA (`jit_compile=True`). Called eagerly, the functions
build (once per model and options) and run such a graph.

Shape letters: B batch, K beam size, S source length, L output buffer length
(`max_length`, or S + 50), V vocabulary, N heads, H per-head width.

Incremental decoding (the default, `use_cache=True`): the source is encoded
once and the cross-attention keys/values are projected once per sentence
(`model.init_cache`), never copied per hypothesis. Each step feeds the K
hypotheses' last tokens to `model.decode_step` side by side, as K "positions"
of their sentence (`[B, K]`, all at output position i): the K queries attend
to the sentence's one copy of the source, and their self-attention
keys/values fill K new slots of the cache (slot `i*K + k` holds step i of
the hypothesis that was k-th at step i). Under XLA the cache is preallocated
(`[B, N, L*K, H]`, static shapes) and written in place; in a plain graph
(eager calls, SavedModel, TF Serving) it starts empty and grows by K slots
per step, so a step copies and attends over the slots in use only, not the
whole buffer. The cache is never reordered when beams change: each
hypothesis keeps its ancestry (`[B, K, L]`, the slot of each of its earlier
steps), and a mask lets it see only those slots. `use_cache=False` is the
slow reference that reruns `model.decode` over the whole prefix at every
step.

The model only needs `encode`, `decode`, `init_cache` and `decode_step` (see
`keras_transformer.model.Transformer`), so tests can pass a stand-in.
"""

import inspect
import weakref

import tensorflow as tf

from keras_transformer.layers.attention import in_place_cache_writes

PAD_ID = 0
# Start and end ids default to the tokenizer's (keras_transformer.tokenizer):
# BOS_ID = 2, EOS_ID = 3.
DEFAULT_BOS_ID = 2
DEFAULT_EOS_ID = 3

# §6.1: maximum output length = input length + 50.
EXTRA_OUTPUT_LENGTH = 50

# When a sentence's search ends (see `beam_search`).
EARLY_STOPPING = ("exact", "k_finished")

# Log-probability of an impossible event. Finite, so sums and differences never
# give NaN.
NEG_INF = -1e9


# ----------------------------------------------------------------------------------
# Public API
# ----------------------------------------------------------------------------------


def length_penalty(length, alpha):
    """GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016, eq. 14), float32."""
    length = tf.cast(length, tf.float32)
    return tf.pow((5.0 + length) / 6.0, tf.cast(alpha, tf.float32))


def greedy_search(
    model,
    source_ids,
    max_length=None,
    min_length=0,
    bos_id=DEFAULT_BOS_ID,
    eos_id=DEFAULT_EOS_ID,
    use_cache=True,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
):
    """Greedy decoding: the most probable token at every step.

    Args:
        model: a `Transformer` (or any object with `encode`, `decode`,
            `init_cache`, `decode_step`).
        source_ids: int `[B, S]`, 0-padded.
        max_length: None for each sentence's own source length (its non-pad
            tokens) + 50 (§6.1); an int for at most that many output tokens.
        min_length: the end token is forbidden among the first `min_length`
            output tokens (CTranslate2's `min_decoding_length`).
        bos_id, eos_id: start and end token ids.
        use_cache: False recomputes the whole prefix at every step (reference).
        max_extra_length: with `max_length=None`, each sentence's output may
            be this many tokens longer than its source (50 in §6.1).

    Returns:
        `token_ids` int32 `[B, L]`: the output tokens without the start token,
        ending with `eos_id` (or at the length limit) and then 0-padded; L is
        the longest output.
        `scores` float32 `[B]`: sum of the tokens' log-probabilities (end
        token included).

    The pad id is never generated.
    """
    options = dict(max_length=max_length, min_length=min_length, bos_id=bos_id, eos_id=eos_id,
                   use_cache=use_cache, max_extra_length=max_extra_length)
    _check_options(**options)
    if tf.executing_eagerly():
        return _eager_call(model, "greedy", source_ids, options)
    source_ids = tf.cast(source_ids, tf.int32)
    token_ids, scores = _greedy_search_graph(model, source_ids, **options)
    return _trim_padding(token_ids), scores


def beam_search(
    model,
    source_ids,
    beam_size=4,
    alpha=0.6,
    max_length=None,
    min_length=0,
    bos_id=DEFAULT_BOS_ID,
    eos_id=DEFAULT_EOS_ID,
    return_all=False,
    use_cache=True,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    early_stopping="exact",
):
    """Beam search with the GNMT length penalty, as in §6.1 (K = 4, alpha = 0.6).

    The search keeps, per sentence, K "alive" hypotheses that are still
    growing and K "finished" ones (ended by the end token or by the length
    limit) ranked by `log P / lp` with `lp = ((5 + len) / 6) ** alpha`
    (Wu et al., 2016). At every step:

    1. each alive hypothesis is extended by every token: K * V candidates,
       scored by their summed log-probability;
    2. the 2K best candidates are kept (at most K of them end with the end
       token, so at least K can go on);
    3. as in a plain beam of width K, the K best candidates form the new
       beam: those of them that end (end token, or length limit) move to the
       finished set, scored `log P / lp(len)`, which keeps its K best;
    4. the K best candidates that do not end become the new alive set (each
       inherits its parent's ancestry in the cache; nothing is copied);
    5. a sentence is done when no alive hypothesis can still beat its best
       finished one (its best log P divided by the penalty at the sentence's
       maximum length is an upper bound of what it can reach, since log P
       only decreases and lp only grows), or when it reaches its length
       limit. Done sentences are frozen; the loop stops when all are done.
       With `early_stopping="k_finished"` a sentence is done as soon as it
       has K finished hypotheses (fairseq's rule): faster, since with
       alpha > 0 the exact bound can keep a sentence going long after its
       best hypothesis ended, but a longer hypothesis that would have scored
       better after more steps is no longer found.

    With `return_all=True` a sentence only stops once no alive hypothesis can
    beat the K-th finished one, so all K returned hypotheses are exact.

    Args:
        model: a `Transformer` (or any object with `encode`, `decode`,
            `init_cache`, `decode_step`).
        source_ids: int `[B, S]`, 0-padded.
        beam_size: K.
        alpha: length penalty exponent; 0 ranks by raw log-probability.
        max_length: None for each sentence's own source length + 50 (§6.1);
            an int for at most that many output tokens.
        min_length: the end token is forbidden among the first `min_length`
            output tokens (CTranslate2's `min_decoding_length`).
        bos_id, eos_id: start and end token ids.
        return_all: return the K finished hypotheses, best first.
        use_cache: False recomputes the whole prefix at every step (reference).
        max_extra_length: with `max_length=None`, each sentence's output may
            be this many tokens longer than its source (50 in §6.1).
        early_stopping: "exact" (default: stop a sentence when no alive
            hypothesis can beat its best finished one, as tensor2tensor does)
            or "k_finished" (stop once K hypotheses have finished).

    Returns:
        `token_ids` int32 `[B, L]` (`[B, K, L]` with `return_all`): without the
        start token, ending with `eos_id` (or at the length limit), then
        0-padded; L is the longest returned output. `scores` float32 `[B]` (`[B, K]`): the length-penalized
        log-probabilities, best first.

    Beam size 1 with alpha = 0 gives the greedy result and score. The pad id
    is never generated.
    """
    options = dict(beam_size=beam_size, alpha=alpha, max_length=max_length, min_length=min_length,
                   bos_id=bos_id, eos_id=eos_id, return_all=return_all, use_cache=use_cache,
                   max_extra_length=max_extra_length, early_stopping=early_stopping)
    _check_options(**options)
    if tf.executing_eagerly():
        return _eager_call(model, "beam", source_ids, options)
    source_ids = tf.cast(source_ids, tf.int32)
    token_ids, scores = _beam_search_graph(model, source_ids, **options)  # [B, K, L], [B, K]
    if not return_all:
        token_ids, scores = token_ids[:, 0], scores[:, 0]  # [B, L], [B]
    return _trim_padding(token_ids), scores


def make_decode_fn(model, method="beam", jit_compile=False, **options):
    """A `tf.function` `source_ids -> (token_ids, scores)` for serving or benchmarks.

    Args:
        model: the `Transformer`.
        method: "beam" or "greedy".
        jit_compile: compile the search with XLA (one compilation per input
            shape).
        **options: keyword arguments of `beam_search` / `greedy_search`
            (e.g. `beam_size=4, alpha=0.6, max_length=None`).

    Returns:
        a `tf.function` with input signature `[None, None]` int32, suitable for
        `tf.saved_model.save` (attach it to a `tf.Module` that also tracks the
        model).

    Example:
    >>> translate = make_decode_fn(model, "beam", beam_size=4, alpha=0.6)
    >>> token_ids, scores = translate(source_ids)
    """
    return _make_decode_fn(lambda: model, method, jit_compile, options)


# ----------------------------------------------------------------------------------
# Greedy search
# ----------------------------------------------------------------------------------


def _greedy_search_graph(model, source_ids, max_length, min_length, bos_id, eos_id, use_cache, max_extra_length):
    """Untrimmed greedy search: `(token_ids [B, L], scores [B])`."""
    batch_size = tf.shape(source_ids)[0]
    buffer_length, limits = _output_limits(model, source_ids, max_length, max_extra_length)  # L, [B]
    memory = model.encode(source_ids, training=False)  # [B, S, D]
    step = _make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache)

    def body(i, token_ids, scores, done, model_state):
        logits, model_state = step(i, token_ids[:, None], model_state)  # [B, 1, V]
        log_probs = _forbid_tokens(tf.nn.log_softmax(logits[:, 0]), i, min_length, eos_id)  # [B, V]
        tokens = tf.argmax(log_probs, axis=-1, output_type=tf.int32)  # [B]
        token_log_probs = tf.reduce_max(log_probs, axis=-1)  # [B]
        # Finished sentences only append padding and keep their score.
        tokens = tf.where(done, PAD_ID, tokens)
        scores += tf.where(done, 0.0, token_log_probs)
        token_ids = _write_position(token_ids, i, tokens)
        done = done | tf.equal(tokens, eos_id) | (i + 1 >= limits)
        return i + 1, token_ids, scores, done, model_state

    def cond(i, token_ids, scores, done, model_state):
        return (i < buffer_length) & tf.logical_not(tf.reduce_all(done))

    loop_vars = (
        tf.constant(0, tf.int32),
        tf.zeros([batch_size, buffer_length], tf.int32),  # token_ids [B, L]
        tf.zeros([batch_size], tf.float32),  # scores [B]
        tf.zeros([batch_size], tf.bool),  # done [B]
        step.initial_state,
    )
    invariants = _shape_invariants(loop_vars, step)
    _, token_ids, scores, _, _ = tf.while_loop(cond, body, loop_vars, shape_invariants=invariants)
    return token_ids, scores


# ----------------------------------------------------------------------------------
# Beam search
# ----------------------------------------------------------------------------------


def _beam_search_graph(
    model, source_ids, beam_size, alpha, max_length, min_length, bos_id, eos_id, return_all, use_cache,
    max_extra_length, early_stopping,
):
    """Untrimmed beam search: finished `(token_ids [B, K, L], scores [B, K])`, best first."""
    k = beam_size
    batch_size = tf.shape(source_ids)[0]
    buffer_length, limits = _output_limits(model, source_ids, max_length, max_extra_length)  # L, [B]

    # Encode once; the K beams of a sentence share its memory.
    memory = model.encode(source_ids, training=False)  # [B, S, D]
    step = _make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache, beam_size=k)
    # Best score a sentence's alive hypotheses could still reach is divided by this.
    max_penalty = length_penalty(limits, alpha)  # [B]

    def body(i, alive_ids, alive_log_probs, finished_ids, finished_scores, done, model_state):
        length = i + 1  # output length after this step

        # 1. Extend every alive hypothesis by every token. Only the best 2K
        #    tokens of each can be among the 2K best candidates of its
        #    sentence, so only those are kept.
        logits, model_state = step(i, alive_ids, model_state)  # [B, K, V]
        token_log_probs, tokens = _top_allowed_tokens(logits, 2 * k, i, min_length, eos_id)  # [B, K, C]
        candidate_log_probs = alive_log_probs[:, :, None] + token_log_probs  # [B, K, C]
        per_beam = tf.shape(tokens)[-1]  # C = 2K, or V if smaller

        # 2. The 2K best candidates: at most K end with EOS, so K can go on.
        top_log_probs, top_flat = tf.math.top_k(
            tf.reshape(candidate_log_probs, [batch_size, k * per_beam]), k=2 * k
        )  # [B, 2K], sorted best first
        top_beams = top_flat // per_beam  # [B, 2K]: the alive hypothesis each extends
        top_tokens = tf.gather(tf.reshape(tokens, [batch_size, k * per_beam]), top_flat, batch_dims=1)  # [B, 2K]
        top_ids = tf.gather(alive_ids, top_beams, batch_dims=1)  # [B, 2K, L]
        top_ids = _write_position(top_ids, i, top_tokens)
        ends = tf.equal(top_tokens, eos_id) | (length >= limits)[:, None]  # [B, 2K]

        # 3. Finished: the candidates that end and rank in the top K (the new
        #    beam), scored with the length penalty; keep the K best overall.
        in_beam = tf.range(2 * k) < k  # [2K]
        new_scores = top_log_probs / length_penalty(length, alpha)  # [B, 2K]
        new_scores = tf.where(ends & in_beam, new_scores, NEG_INF)
        merged_scores = tf.concat([finished_scores, new_scores], axis=1)  # [B, 3K]
        merged_ids = tf.concat([finished_ids, top_ids], axis=1)  # [B, 3K, L]
        new_finished_scores, keep = tf.math.top_k(merged_scores, k=k)  # [B, K]
        new_finished_ids = tf.gather(merged_ids, keep, batch_dims=1)  # [B, K, L]

        # 4. Alive: the K best candidates that do not end.
        new_alive_log_probs, keep = tf.math.top_k(tf.where(ends, NEG_INF, top_log_probs), k=k)  # [B, K]
        new_alive_ids = tf.gather(top_ids, keep, batch_dims=1)  # [B, K, L]
        parents = tf.gather(top_beams, keep, batch_dims=1)  # [B, K]
        model_state = step.reorder(model_state, parents)

        # 5. Freeze sentences that were already done; mark the newly done ones.
        frozen = done[:, None]  # [B, 1]
        alive_ids = tf.where(frozen[..., None], alive_ids, new_alive_ids)
        alive_log_probs = tf.where(frozen, alive_log_probs, new_alive_log_probs)
        finished_ids = tf.where(frozen[..., None], finished_ids, new_finished_ids)
        finished_scores = tf.where(frozen, finished_scores, new_finished_scores)
        if early_stopping == "k_finished":
            # The finished set is sorted: the K-th is real once K have finished.
            cannot_improve = finished_scores[:, -1] > NEG_INF / 2  # [B]
        else:
            # Alive hypotheses are sorted: the first one has the best log P.
            best_alive_bound = alive_log_probs[:, 0] / max_penalty  # [B]
            target = finished_scores[:, -1] if return_all else finished_scores[:, 0]  # [B]
            cannot_improve = target >= best_alive_bound
        done = done | (length >= limits) | cannot_improve
        return i + 1, alive_ids, alive_log_probs, finished_ids, finished_scores, done, model_state

    def cond(i, alive_ids, alive_log_probs, finished_ids, finished_scores, done, model_state):
        return (i < buffer_length) & tf.logical_not(tf.reduce_all(done))

    # Only beam 0 starts alive: the other K-1 copies of the start token would
    # otherwise fill the first beam with duplicates.
    initial_log_probs = tf.tile(
        tf.constant([[0.0] + [NEG_INF] * (k - 1)], tf.float32), [batch_size, 1]
    )  # [B, K]
    loop_vars = (
        tf.constant(0, tf.int32),
        tf.zeros([batch_size, k, buffer_length], tf.int32),  # alive_ids [B, K, L]
        initial_log_probs,  # alive_log_probs [B, K]
        tf.zeros([batch_size, k, buffer_length], tf.int32),  # finished_ids [B, K, L]
        tf.fill([batch_size, k], NEG_INF),  # finished_scores [B, K]
        tf.zeros([batch_size], tf.bool),  # done [B]
        step.initial_state,
    )
    outputs = tf.while_loop(cond, body, loop_vars, shape_invariants=_shape_invariants(loop_vars, step))
    # A sentence ends at its length limit at the latest, where the whole new
    # beam finishes: every sentence has finished hypotheses.
    return outputs[3], outputs[4]


# ----------------------------------------------------------------------------------
# One decoder step, with or without the cache
# ----------------------------------------------------------------------------------


class _CachedStep:
    """Feeds the K hypotheses of each sentence to `model.decode_step` side by side.

    State: `(self_attention_cache, ancestry)`. Slot `j*K + k` of the cache is
    written at step j by the hypothesis then k-th in the beam; `ancestry
    [B, K, L]` holds, for each hypothesis, the beam index its prefix had at
    each earlier step, so hypothesis k at step i sees slots
    `j*K + ancestry[k, j]` for j < i and `i*K + k` (its own step). Under XLA
    the cache has all `L*K` slots from the start; otherwise it grows.
    """

    def __init__(self, model, memory, source_ids, buffer_length, bos_id, beam_size):
        self.model = model
        self.bos_id = bos_id
        self.beam_size = beam_size
        self.buffer_length = buffer_length
        self.memory = memory  # [B, S, D]: one copy per sentence, shared by its hypotheses
        self.source_ids = source_ids
        # XLA needs static shapes: one preallocated buffer written in place.
        # A plain graph appends K slots per step instead of copying the buffer.
        # The attention layers' own test decides, so both always agree.
        self.growing = not in_place_cache_writes()
        slots = 0 if self.growing else buffer_length * beam_size
        cache = model.init_cache(memory, slots)  # cross K/V computed once
        self.invariant = {key: value for key, value in cache.items() if key != "self"}  # "cross", ...
        ancestry = tf.zeros([tf.shape(source_ids)[0], beam_size, buffer_length], tf.int32)
        self.initial_state = (cache["self"], ancestry)

    @property
    def state_shape_invariants(self):
        """The state keeps its shapes, except the slot axis of a growing cache."""
        self_cache, ancestry = self.initial_state

        def slots_vary(tensor):  # [B, N, slots, H]
            shape = tensor.shape.as_list()
            shape[2] = None
            return tf.TensorShape(shape)

        cache_shapes = tf.nest.map_structure(slots_vary if self.growing else (lambda t: t.shape), self_cache)
        return cache_shapes, ancestry.shape

    def __call__(self, i, token_ids, state):
        """`token_ids [B, K, L]` generated so far -> (logits of step i [B, K, V], state)."""
        self_cache, ancestry = state
        k = self.beam_size
        previous = tf.gather(token_ids, tf.maximum(i - 1, 0), axis=2)  # [B, K]
        previous = tf.where(i > 0, previous, self.bos_id)
        steps = tf.range(self.buffer_length)  # [L]
        ancestry = tf.where(tf.equal(steps, i), tf.range(k)[:, None], ancestry)  # [B, K, L]
        # The slots of steps 0..i: all L*K of a preallocated cache (later ones masked).
        seen = i + 1 if self.growing else self.buffer_length  # L'
        visible = tf.equal(ancestry[:, :, :seen, None], tf.range(k)) & (steps[:seen] <= i)[:, None]  # [B, K, L', K]
        mask = tf.reshape(visible, [tf.shape(ancestry)[0], k, seen * k])  # [B, K, L'*K]
        logits, cache = self.model.decode_step(
            previous,
            self.memory,
            self.source_ids,
            {"self": self_cache, **self.invariant},
            i * k,
            positions=tf.fill([k], i),
            self_attention_mask=mask,
        )  # [B, K, V]
        return logits, (cache["self"], ancestry)

    @staticmethod
    def reorder(state, parents):
        """New hypothesis k continues `parents [B, K]`: it inherits that one's ancestry, not a cache copy."""
        self_cache, ancestry = state
        return self_cache, tf.gather(ancestry, parents, batch_dims=1)


class _UncachedStep:
    """Reference: reruns `model.decode` over the whole prefix at every step; no state."""

    initial_state = ()
    state_shape_invariants = ()

    def __init__(self, model, memory, source_ids, buffer_length, bos_id, beam_size):
        self.model = model
        self.bos_id = bos_id
        self.memory = _tile_beams(memory, beam_size)  # [B*K, S, D]
        self.source_ids = _tile_beams(source_ids, beam_size)

    def __call__(self, i, token_ids, state):
        """`token_ids [B, K, L]` -> (logits of step i [B, K, V], state)."""
        batch, k = tf.shape(token_ids)[0], tf.shape(token_ids)[1]
        flat_ids = tf.reshape(token_ids, [batch * k, -1])  # [B*K, L]
        start = tf.fill([batch * k, 1], self.bos_id)
        inputs = tf.concat([start, flat_ids[:, :i]], axis=1)  # [B*K, i + 1]: start, then the prefix
        logits = self.model.decode(inputs, self.memory, self.source_ids, training=False)
        logits = tf.gather(logits, i, axis=1)  # [B*K, V]
        vocab_size = logits.shape[-1] if logits.shape[-1] is not None else tf.shape(logits)[-1]
        return tf.reshape(logits, [batch, k, vocab_size]), state

    @staticmethod
    def reorder(state, parents):
        return state


def _make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache, beam_size=1):
    step_class = _CachedStep if use_cache else _UncachedStep
    return step_class(model, memory, source_ids, buffer_length, bos_id, beam_size)


# ----------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------


def _shape_invariants(loop_vars, step):
    """Every loop variable keeps its shape, except what the step's state lets change."""
    return tf.nest.map_structure(lambda tensor: tensor.shape, loop_vars[:-1]) + (step.state_shape_invariants,)


def _output_limits(model, source_ids, max_length, max_extra_length=EXTRA_OUTPUT_LENGTH):
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


def _forbid_tokens(log_probs, i, min_length, eos_id):
    """Pad is never generated; the end token not before `min_length` tokens. `[..., V]`."""
    token = tf.range(tf.shape(log_probs)[-1])
    forbidden = tf.equal(token, PAD_ID)
    if min_length > 0:
        forbidden |= tf.equal(token, eos_id) & (i < min_length)
    return tf.where(forbidden, NEG_INF, log_probs)


def _top_allowed_tokens(logits, count, i, min_length, eos_id):
    """The `count` most probable allowed tokens of each row of `logits [R, K, V]`.

    Returns `(log_probs, ids)`, each `[R, K, C]` with C = min(count, V), best
    first: log P(token) = logit - logsumexp(logits), over the whole vocabulary.
    Pad is never allowed, the end token not before `min_length` tokens: the
    top `count` + (number of forbidden tokens) are taken, the forbidden ones
    masked, and the best `count` kept. Exact, with no pass over the
    vocabulary besides the top-k and one softmax.
    """
    vocab_size = logits.shape[-1]
    forbidden_count = 1 + int(min_length > 0)
    wanted = count + forbidden_count
    if vocab_size is not None:
        wanted, count = min(wanted, vocab_size), min(count, vocab_size)
    values, ids = _blocked_top_k(logits, wanted)  # [R, K, count + forbidden], best first
    log_normalizer = tf.reduce_logsumexp(logits, axis=-1, keepdims=True)  # [R, K, 1]
    forbidden = tf.equal(ids, PAD_ID)
    if min_length > 0:
        forbidden |= tf.equal(ids, eos_id) & (i < min_length)
    values, keep = tf.math.top_k(tf.where(forbidden, NEG_INF, values - log_normalizer), k=count)
    return values, tf.gather(ids, keep, batch_dims=2)


def _blocked_top_k(x, k):
    """Exact `tf.math.top_k(x, k)` over the last axis of `x [R, K, V]`, k << V: 3-4x faster on CPU.

    The V entries are cut into blocks of about sqrt(V). Each of the k largest
    entries lies in a block whose maximum is at least as large, and at most k
    blocks have such a maximum: the k blocks with the largest maxima hold the
    top k. So: one max-reduction over the blocks, a top-k over the block
    maxima, and a top-k over the k chosen blocks (k*sqrt(V) entries) instead of
    a top-k over V.
    """
    vocab_size = x.shape[-1]
    block = _block_size(vocab_size, k)
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


def _block_size(vocab_size, k):
    """A divisor of V near sqrt(V) leaving more than k blocks, or None (plain top-k)."""
    if vocab_size is None or vocab_size < 64 * k:
        return None
    root = vocab_size**0.5
    divisors = [d for d in range(int(root / 2), int(2 * root) + 1) if d > 0 and vocab_size % d == 0]
    divisors = [d for d in divisors if vocab_size // d > k]
    return min(divisors, key=lambda d: abs(d - root)) if divisors else None


def _write_position(token_ids, i, tokens):
    """`token_ids[..., i] = tokens` for `token_ids [..., L]`, `tokens [...]` (XLA-friendly)."""
    at_i = tf.equal(tf.range(tf.shape(token_ids)[-1]), i)
    return tf.where(at_i, tokens[..., None], token_ids)


def _tile_beams(tensor, beam_size):
    """`[B, ...]` -> `[B*K, ...]`, each row repeated K times in a row."""
    if beam_size == 1:
        return tensor
    shape = tf.shape(tensor)
    tiled = tf.tile(tensor[:, None], [1, beam_size] + [1] * (len(tensor.shape) - 1))
    return tf.reshape(tiled, tf.concat([[shape[0] * beam_size], shape[1:]], axis=0))


def _trim_padding(token_ids):
    """Drops trailing columns that are padding in every row (a bounded dynamic shape under XLA)."""
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(token_ids, PAD_ID), tf.int32), axis=-1)
    return token_ids[..., : tf.reduce_max(lengths)]


def _check_options(beam_size=1, alpha=0.0, max_length=None, min_length=0, bos_id=2, eos_id=3,
                   max_extra_length=EXTRA_OUTPUT_LENGTH, early_stopping="exact", **_):
    if early_stopping not in EARLY_STOPPING:
        raise ValueError(f"early_stopping must be one of {', '.join(EARLY_STOPPING)}, got {early_stopping!r}.")
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}.")
    if not float(alpha) >= 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha!r}.")
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be None or a positive integer, got {max_length!r}.")
    if isinstance(max_extra_length, bool) or not isinstance(max_extra_length, int) or max_extra_length < 1:
        raise ValueError(f"max_extra_length must be a positive integer, got {max_extra_length!r}.")
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 0:
        raise ValueError(f"min_length must be a non-negative integer, got {min_length!r}.")
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int) or value == PAD_ID:
            raise ValueError(f"{name} must be an integer token id other than the pad id 0, got {value!r}.")


# Graph functions built for eager calls, per model (weakly) and options.
_EAGER_FUNCTIONS = weakref.WeakKeyDictionary()


def _eager_call(model, method, source_ids, options):
    functions = _EAGER_FUNCTIONS.setdefault(model, {})
    key = (method, tuple(sorted(options.items())))
    if key not in functions:
        model_ref = weakref.ref(model)  # the cache must not keep the model alive
        functions[key] = _make_decode_fn(model_ref, method, False, options)
    return functions[key](tf.cast(source_ids, tf.int32))


def _make_decode_fn(get_model, method, jit_compile, options):
    if method not in ("beam", "greedy"):
        raise ValueError(f"method must be 'beam' or 'greedy', got {method!r}.")
    search = beam_search if method == "beam" else greedy_search
    unknown = sorted(set(options) - set(inspect.signature(search).parameters) - {"model", "source_ids"})
    if unknown:
        raise TypeError(f"{search.__name__} has no option(s) {', '.join(unknown)}.")
    _check_options(**options)
    signature = [tf.TensorSpec([None, None], tf.int32, name="source_ids")]

    # No autograph: the search is explicit TensorFlow control flow already.
    @tf.function(input_signature=signature, jit_compile=bool(jit_compile), autograph=False)
    def decode(source_ids):
        return search(get_model(), source_ids, **options)

    return decode
