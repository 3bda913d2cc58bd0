"""One decoder step of the search, with the incremental cache or without (reference).

Shape letters: B batch, K beam size, S source length, L output buffer length,
V vocabulary, N heads, H per-head width.
"""

import tensorflow as tf

from keras_transformer.decoding.tokens import top_allowed_tokens, top_allowed_tokens_of_rows
from keras_transformer.layers.attention import in_place_cache_writes


class _CachedStep:
    """Feeds the K hypotheses of each sentence to `model.decode_step` side by side.

    State: `(self_attention_cache, ancestry, sentences)`. Slot `j*K + k` of
    the cache is written at step j by the hypothesis then k-th in the beam;
    `ancestry [B, K, L]` holds, for each hypothesis, the beam index its
    prefix had at each earlier step, so hypothesis k at step i sees slots
    `j*K + ancestry[k, j]` for j < i and `i*K + k` (its own step).
    `sentences` is what each sentence keeps for the whole search (its memory,
    source ids and cross-attention keys/values), in the state so that
    `select` can drop finished sentences. Under XLA the cache has all `L*K`
    slots from the start and the batch is fixed; otherwise the cache grows
    and the batch may shrink.
    """

    def __init__(self, model, memory, source_ids, buffer_length, bos_id, beam_size):
        self.model = model
        self.bos_id = bos_id
        self.beam_size = beam_size
        self.buffer_length = buffer_length
        # XLA needs static shapes: one preallocated buffer written in place.
        # A plain graph appends K slots per step instead of copying the buffer.
        # The attention layers' own test decides, so both always agree.
        self.growing = not in_place_cache_writes()
        slots = 0 if self.growing else buffer_length * beam_size
        cache = model.init_cache(memory, slots)  # cross K/V computed once
        # Per sentence (memory is one copy per sentence, shared by its hypotheses) ...
        sentences = {
            "memory": memory,
            "source_ids": source_ids,
            **{key: value for key, value in cache.items() if key not in ("self", "shared")},
        }
        # ... and, without a batch axis, shared by all sentences (`init_cache`'s "shared").
        self.shared = {"shared": cache["shared"]} if "shared" in cache else {}
        ancestry = tf.zeros([tf.shape(source_ids)[0], beam_size, buffer_length], tf.int32)
        self.initial_state = (cache["self"], ancestry, sentences)

    @property
    def can_select(self):
        """Whether `select` may shrink the batch (a plain graph; XLA keeps static shapes)."""
        return self.growing

    @property
    def state_shape_invariants(self):
        """A growing cache changes its slot axis; a shrinking batch, every batch axis."""

        def vary(tensor, axes):
            shape = tensor.shape.as_list()
            for axis in axes:
                shape[axis] = None
            return tf.TensorShape(shape)

        batch_axis = (0,) if self.can_select else ()
        slot_axes = (2,) if self.growing else ()  # [B, N, slots, H]
        self_cache, ancestry, sentences = self.initial_state
        return (
            tf.nest.map_structure(lambda t: vary(t, batch_axis + slot_axes), self_cache),
            vary(ancestry, batch_axis),
            tf.nest.map_structure(lambda t: vary(t, batch_axis), sentences),
        )

    def top_tokens(
        self,
        i,
        token_ids,
        state,
        count,
        min_length,
        eos_id,
        first=False,
        rows=None,
        no_repeat_ngram_size=0,
        forced=None,
    ):
        """`(log_probs, ids [B, K, C], state)`: `top_allowed_tokens` of step i (`first`: via `first`).

        `no_repeat_ngram_size`: as `top_allowed_tokens`', over the
        hypotheses' `token_ids` (step 0, `first`, has no n-gram to repeat).
        `rows [B, K]`: only those hypotheses need candidates
        (`top_allowed_tokens_of_rows`); with a model that projects its
        decoder output on its own (`step_logits`), only they are projected,
        to logits in its compute dtype (`top_allowed_tokens` takes bfloat16
        logits as they are). `forced [B, K]`: the tokens target prefixes
        force (`tokens.force_tokens`; 0: none), or None.
        """
        # `step_logits` reads the output matrix from the shared entries only.
        to_logits = None
        if hasattr(self.model, "step_logits"):

            def to_logits(hidden):
                return self.model.step_logits(hidden, self.shared, dtype=None)

        if first:  # searches its one row per sentence, then copies the few candidates, not the logits
            logits, state = self.first(token_ids, state, to_logits=to_logits)  # [B, 1, V]
            forced = None if forced is None else forced[:, :1]  # the same for all hypotheses of a sentence
            log_probs, ids = _top_tokens(logits, None, rows, count, i, min_length, eos_id, forced=forced)  # [B, 1, C]
            return tf.tile(log_probs, [1, self.beam_size, 1]), tf.tile(ids, [1, self.beam_size, 1]), state
        output, state = self(i, token_ids, state, project=to_logits is None)
        blocking = (token_ids, no_repeat_ngram_size)
        return (*_top_tokens(output, to_logits, rows, count, i, min_length, eos_id, blocking, forced), state)

    def __call__(self, i, token_ids, state, project=True):
        """`token_ids [B, K, L]` generated so far -> (logits of step i [B, K, V], state).

        `project=False`: the decoder output `[B, K, D]` instead (`model.step_logits` projects it).
        """
        self_cache, ancestry, sentences = state
        k = self.beam_size
        previous = tf.gather(token_ids, tf.maximum(i - 1, 0), axis=2)  # [B, K]
        previous = tf.where(i > 0, previous, self.bos_id)
        steps = tf.range(self.buffer_length)  # [L]
        ancestry = self._own_slots_at(i, ancestry)
        # The slots of steps 0..i: all L*K of a preallocated cache (later ones masked).
        seen = i + 1 if self.growing else self.buffer_length  # L'
        visible = tf.equal(ancestry[:, :, :seen, None], tf.range(k)) & (steps[:seen] <= i)[:, None]  # [B, K, L', K]
        mask = tf.reshape(visible, [tf.shape(ancestry)[0], k, seen * k])  # [B, K, L'*K]
        logits, cache = self.model.decode_step(
            previous,
            sentences["memory"],
            sentences["source_ids"],
            self._decoder_cache(self_cache, sentences),
            i * k,
            positions=tf.fill([k], i),
            self_attention_mask=mask,
            **_projection_option(project),
        )  # [B, K, V]
        return logits, (cache["self"], ancestry, sentences)

    def _own_slots_at(self, i, ancestry):
        """`ancestry [B, K, L]` with step i of hypothesis k in slot k of that step (`i*K + k`)."""
        at_i = tf.equal(tf.range(self.buffer_length), i)  # [L]
        # The buffer length is a tensor here: with L = 1, broadcasting would lose the static L of the ancestry,
        # which the while loop's shape invariant holds it to.
        return tf.ensure_shape(tf.where(at_i, tf.range(self.beam_size)[:, None], ancestry), ancestry.shape)

    def _decoder_cache(self, self_cache, sentences):
        """The `model.decode_step` cache: the self-attention slots, each sentence's own and the shared entries."""
        return {
            "self": self_cache,
            **{key: value for key, value in sentences.items() if key not in ("memory", "source_ids")},
            **self.shared,
        }

    @property
    def has_first(self):
        """Whether `first` runs step 0: in a plain graph only.

        It runs outside the while loop, and under XLA a decoder call there
        made the source ids compile-time constants of the computation: XLA
        compiled it again at every call. XLA keeps K rows at step 0.
        """
        return self.growing

    def first(self, token_ids, state, to_logits=None):
        """Step 0, like `__call__(0, ...)`, computing one hypothesis per sentence instead of K.

        Returns `(logits [B, 1, V], state)`.

        `to_logits`: projects the decoder output (`model.step_logits`) instead of `decode_step`.

        At step 0 all K hypotheses of a sentence feed the start token at
        position 0, so their logits and cache rows are equal: one is computed,
        its cache rows copied K times (as CTranslate2 expands its beam after
        the first step), and its logits returned once, for `top_tokens` to
        copy the candidates it picks from them. Only beam 0 is alive then
        (`_initial_beams`), so the other K - 1 rows could not change the
        result anyway. Needs the growing cache (`has_first`).
        """
        self_cache, ancestry, sentences = state
        k = self.beam_size
        batch = tf.shape(ancestry)[0]
        start = tf.fill([batch, 1], self.bos_id)  # [B, 1]
        mask = tf.ones([batch, 1, 1], tf.bool)  # the one slot, its own
        logits, cache = self.model.decode_step(
            start,
            sentences["memory"],
            sentences["source_ids"],
            self._decoder_cache(self_cache, sentences),
            0,
            positions=tf.zeros([1], tf.int32),
            self_attention_mask=mask,
            **_projection_option(to_logits is None),
        )
        if to_logits is not None:
            logits = to_logits(logits)
        # The K slots of step 0 all hold the one computed row.
        self_cache = tf.nest.map_structure(lambda t: tf.tile(t, [1, 1, k, 1]), cache["self"])
        return logits, (self_cache, self._own_slots_at(0, ancestry), sentences)

    @staticmethod
    def reorder(state, parents):
        """New hypothesis k continues `parents [B, K]`: it inherits that one's ancestry, not a cache copy."""
        self_cache, ancestry, sentences = state
        return self_cache, tf.gather(ancestry, parents, batch_dims=1), sentences

    @staticmethod
    def select(state, keep):
        """The state of the sentences at batch indices `keep [B']` only (batch axis 0 of every tensor)."""
        return tf.nest.map_structure(lambda tensor: tf.gather(tensor, keep), state)


class _UncachedStep:
    """Reference: reruns `model.decode` over the whole prefix at every step; no state."""

    initial_state = ()
    state_shape_invariants = ()
    can_select = False  # the memory is captured, tiled per hypothesis

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

    def top_tokens(
        self,
        i,
        token_ids,
        state,
        count,
        min_length,
        eos_id,
        first=False,
        rows=None,
        no_repeat_ngram_size=0,
        forced=None,
    ):
        """`(log_probs, ids [B, K, C], state)`: `top_allowed_tokens` of step i's logits.

        `rows`, `no_repeat_ngram_size`, `forced`: as `_CachedStep.top_tokens`'.
        """
        logits, state = self(i, token_ids, state)
        blocking = (token_ids, no_repeat_ngram_size)
        return (*_top_tokens(logits, None, rows, count, i, min_length, eos_id, blocking, forced), state)

    @staticmethod
    def reorder(state, parents):
        return state


def _projection_option(project):
    """`decode_step`'s keyword for `project`: none when projecting, so stand-ins without it still work."""
    return {} if project else {"project": False}


def _top_tokens(output, to_logits, rows, count, i, min_length, eos_id, blocking=(None, 0), forced=None):
    """`top_allowed_tokens` of a step's logits (`to_logits` None) or decoder output, for `rows` only if given.

    `blocking`: `(token_ids [B, K, L], no_repeat_ngram_size)`, and `forced [B, K]`, for `top_allowed_tokens`.
    """
    to_logits = to_logits or (lambda logits: logits)
    if rows is None:
        return top_allowed_tokens(to_logits(output), count, i, min_length, eos_id, *blocking, forced=forced)
    return top_allowed_tokens_of_rows(output, to_logits, rows, count, i, min_length, eos_id, *blocking, forced=forced)


def make_step_fn(model, memory, source_ids, buffer_length, bos_id, use_cache, beam_size=1):
    step_class = _CachedStep if use_cache else _UncachedStep
    return step_class(model, memory, source_ids, buffer_length, bos_id, beam_size)


def _tile_beams(tensor, beam_size):
    """`[B, ...]` -> `[B*K, ...]`, each row repeated K times in a row."""
    if beam_size == 1:
        return tensor
    shape = tf.shape(tensor)
    tiled = tf.tile(tensor[:, None], [1, beam_size] + [1] * (len(tensor.shape) - 1))
    return tf.reshape(tiled, tf.concat([[shape[0] * beam_size], shape[1:]], axis=0))
