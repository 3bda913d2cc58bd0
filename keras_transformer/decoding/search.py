"""The public searches: `greedy_search`, `beam_search` and `make_decode_fn` (§6.1).

Argument checks, the eager entry points (which build and cache one graph per
model and options) and the `tf.function` for SavedModels. The loops
themselves are in `keras_transformer.decoding.loops`.
"""

import inspect
import weakref

import numpy as np
import tensorflow as tf

from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    DEFAULT_LENGTH_PENALTY,
    EXTRA_OUTPUT_LENGTH,
    NEG_INF,
    check_alpha,
    check_early_stopping,
    check_length_penalty,
    refuse_bad_ids,
)
from keras_transformer.decoding.loops import beam_search_graph, greedy_search_graph
from keras_transformer.decoding.prefixes import check_target_prefix
from keras_transformer.decoding.tokens import output_limits, trim_padding
from keras_transformer.errors import ParameterError
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID


def greedy_search(
    model,
    source_ids,
    max_length=None,
    min_length=0,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    use_cache=True,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    no_repeat_ngram_size=0,
    target_prefix=None,
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
        no_repeat_ngram_size: N > 0 never repeats an N-gram within an output
            (n-gram blocking; not in the paper): a token that would complete
            an N-gram already in it is not taken. 0 (default): off, and not in
            the graph. See `beam_search`.
        target_prefix: None, or int `[B, P]`: the tokens each output starts
            with, 0-padded (see `beam_search`).

    Returns:
        `token_ids` int32 `[B, L]`: the output tokens without the start token,
        ending with `eos_id` (or at the length limit) and then 0-padded; L is
        the longest output.
        `scores` float32 `[B]`: sum of the tokens' log-probabilities (end
        token included).

    The pad id is never generated.
    """
    options = dict(
        max_length=max_length,
        min_length=min_length,
        bos_id=bos_id,
        eos_id=eos_id,
        use_cache=use_cache,
        max_extra_length=max_extra_length,
        no_repeat_ngram_size=no_repeat_ngram_size,
    )
    _check_options(**options)
    if tf.executing_eagerly():
        return _eager_call(model, "greedy", source_ids, options, target_prefix)
    source_ids = tf.cast(source_ids, tf.int32)
    token_ids, scores = greedy_search_graph(model, source_ids, **options, target_prefix=target_prefix)
    return trim_padding(token_ids), scores


def sampling_search(
    model,
    source_ids,
    temperature=1.0,
    top_k=0,
    seed=None,
    max_length=None,
    min_length=0,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    use_cache=True,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    no_repeat_ngram_size=0,
    target_prefix=None,
):
    """Random sampling, token by token, for back-translation and data augmentation.

    At every step the next token is drawn from the model's distribution
    divided by `temperature` (softmax(logits / T)), restricted to the `top_k`
    most probable tokens when `top_k > 0` (Fan et al., 2018). Not in the
    paper, which decodes by beam search (§6.1); output limits and the other
    arguments are those of `greedy_search`.

    Args:
        temperature: finite and at least float32's smallest normal number
            (1.2e-38); 1 samples from the model, smaller is closer to greedy.
        top_k: 0 for the whole vocabulary; 1 is greedy search.
        seed: an int makes the draws reproducible: stateless random ops
            keyed by the seed, the batch's source tokens and the step, so a
            batch draws the same samples at every call, and other batches
            other ones. A sentence's draw also depends on its row and its
            batch: the same sentence in another batch gets another sample.
            None draws a new seed at every call.
        no_repeat_ngram_size: N > 0 never draws a token that would repeat an
            N-gram of the output (its probability is 0); 0 (default): off.
        target_prefix: None, or int `[B, P]`: the tokens each output starts
            with (drawn from the model after them; see `beam_search`).

    Returns:
        `(token_ids [B, L], scores [B])` as `greedy_search`; a score is the sum
        of the sampled tokens' log-probabilities under the model (temperature 1,
        whole vocabulary).
    """
    options = dict(
        temperature=temperature,
        top_k=top_k,
        seed=seed,
        max_length=max_length,
        min_length=min_length,
        bos_id=bos_id,
        eos_id=eos_id,
        use_cache=use_cache,
        max_extra_length=max_extra_length,
        no_repeat_ngram_size=no_repeat_ngram_size,
    )
    _check_options(**options)
    if tf.executing_eagerly():
        return _eager_call(model, "sampling", source_ids, options, target_prefix)
    source_ids = tf.cast(source_ids, tf.int32)
    if seed is None:
        base_seed = tf.random.uniform([], maxval=2**31 - 1, dtype=tf.int32)
    else:
        # Keyed by the batch too: with the seed alone, row r of every batch would draw the same numbers.
        base_seed = tf.bitwise.bitwise_xor(tf.constant(seed, tf.int32), _batch_key(source_ids))

    def choose_tokens(log_probs, i):
        # Shifted so that the best token is at 0: a tiny temperature then makes the others -inf, not all of them.
        logits = (log_probs - tf.reduce_max(log_probs, axis=-1, keepdims=True)) / tf.cast(temperature, log_probs.dtype)
        if top_k:
            kth = tf.math.top_k(logits, k=min(top_k, logits.shape[-1] or top_k)).values[:, -1:]  # [B, 1]
            logits = tf.where(logits < kth, NEG_INF, logits)
        draws = tf.random.stateless_categorical(logits, 1, seed=tf.stack([base_seed, i]), dtype=tf.int32)
        return draws[:, 0]

    greedy_options = {k: v for k, v in options.items() if k not in ("temperature", "top_k", "seed")}
    token_ids, scores = greedy_search_graph(
        model, source_ids, **greedy_options, choose_tokens=choose_tokens, target_prefix=target_prefix
    )
    return trim_padding(token_ids), scores


def _batch_key(source_ids):
    """int32 scalar in `[0, 2**31 - 1)` from the tokens of a batch `[B, S]` and their (row, column): the
    same sentences in the same rows give the same key whatever the padded width (padding adds 0)."""
    shape = tf.shape(source_ids, out_type=tf.int64)
    places = tf.range(shape[0])[:, None] * 1_000_003 + tf.range(shape[1])[None, :]  # [B, S]
    weights = (places % 2147483647 + 1) * 2654435761 % 2147483647  # a different multiplier for every place
    products = tf.cast(source_ids, tf.int64) * weights % 2147483647
    return tf.cast(tf.reduce_sum(products) % 2147483647, tf.int32)


def beam_search(
    model,
    source_ids,
    beam_size=DEFAULT_BEAM_SIZE,
    alpha=DEFAULT_ALPHA,
    max_length=None,
    min_length=0,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    return_all=False,
    use_cache=True,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    early_stopping=DEFAULT_EARLY_STOPPING,
    no_repeat_ngram_size=0,
    target_prefix=None,
    length_penalty=DEFAULT_LENGTH_PENALTY,
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

    `length_penalty="average"` divides by `len ** alpha` instead (fairseq's
    `--lenpen`, CTranslate2's `length_penalty`; with alpha = 1 the average
    log-probability per token): not the paper's, for reproducing recipes that
    were tuned with it. It grows faster with the length than GNMT's, so with
    the same alpha it favours longer outputs. Both grow with the length, so
    step 5's bound holds for either.

    N-gram blocking (`no_repeat_ngram_size` N > 0; fairseq's, CTranslate2's
    and Hugging Face's option, not the paper's) keeps a model from looping
    ("the the the", a phrase over and over): in step 1, a token that would
    complete an N-gram its hypothesis already holds gets log-probability
    -inf (`NEG_INF`), so no hypothesis ever holds an N-gram twice. Each
    hypothesis is checked against its own tokens only (not the start token,
    not its beam mates'), and the other tokens keep the model's
    log-probabilities, so scores stay comparable. Its last N - 1 tokens are
    compared with every (N-1)-gram of its output at once and the tokens that
    followed the matches are masked (`tokens.blocked_ngram_tokens`): a few
    vectorized ops per step over `[B*K, L]` and one over `[B*K, V]`. Should
    blocking and `min_length` leave no token, the end token is allowed.

    Target prefixes (`target_prefix`; CTranslate2's and Sockeye's
    `target_prefix`, fairseq's `--prefix-size`; not the paper's) force the
    start of each output and let the search continue it, for interactive
    translation, terminology or autocompletion: while a sentence's prefix
    lasts, each of its hypotheses has the prefix's next token as its only
    candidate, scored with the model's log-probability
    (`decoding.prefixes`). So every returned hypothesis starts with the
    prefix, and its score is the length-penalized log P of the whole output,
    prefix included, as forced decoding (`score_outputs`) gives it. A forced
    token wins over `min_length` and n-gram blocking; `min_length` counts the
    prefix. A prefix must not hold the end token, nor be longer than its
    sentence's maximum output length.

    With "exact" stopping, an alive hypothesis whose own bound cannot beat
    that finished score can no longer change the result: all its
    continuations score lower, and every candidate they could displace ranks
    above them. In a plain graph such hypotheses get no candidates, and their
    decoder output is not projected to the vocabulary: the same results,
    with less computation.

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
        no_repeat_ngram_size: N > 0 blocks repeated N-grams (above); 0
            (default): off, and none of it is in the graph.
        length_penalty: "gnmt" (default, §6.1's) or "average" (above);
            `loops.length_penalty` computes either.
        target_prefix: None (default; none of it is in the graph), or int
            `[B, P]`: each sentence's prefix (above), 0-padded; a row of
            zeros for a sentence without one. Called eagerly, a bad prefix is
            a `ParameterError` naming `target_prefix`.

    Returns:
        `token_ids` int32 `[B, L]` (`[B, K, L]` with `return_all`): without the
        start token, ending with `eos_id` (or at the length limit), then
        0-padded; L is the longest returned output. `scores` float32 `[B]` (`[B, K]`): the length-penalized
        log-probabilities, best first. Where fewer than K hypotheses exist (a
        prefix as long as the output leaves one), the others are all padding,
        scored `NEG_INF`.

    Beam size 1 with alpha = 0 gives the greedy result and score. The pad id
    is never generated.

    Example:
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> token_ids, _ = beam_search(model, tf.constant([[5, 6, 7, 3]]), max_length=12, no_repeat_ngram_size=2)
    >>> bigrams = [tuple(token_ids[0, j : j + 2].numpy()) for j in range(token_ids.shape[1] - 1)]
    >>> len(bigrams) == len(set(bigrams))  # no bigram twice in the output
    True
    """
    options = dict(
        beam_size=beam_size,
        alpha=alpha,
        max_length=max_length,
        min_length=min_length,
        bos_id=bos_id,
        eos_id=eos_id,
        return_all=return_all,
        use_cache=use_cache,
        max_extra_length=max_extra_length,
        early_stopping=early_stopping,
        no_repeat_ngram_size=no_repeat_ngram_size,
        length_penalty=length_penalty,
    )
    _check_options(**options)
    if tf.executing_eagerly():
        return _eager_call(model, "beam", source_ids, options, target_prefix)
    source_ids = tf.cast(source_ids, tf.int32)
    token_ids, scores = beam_search_graph(model, source_ids, **options, target_prefix=target_prefix)  # [B, K, ...]
    if not return_all:
        token_ids, scores = token_ids[:, 0], scores[:, 0]  # [B, L], [B]
    return trim_padding(token_ids), scores


def make_decode_fn(model, method="beam", jit_compile=False, with_target_prefix=False, **options):
    """A `tf.function` `source_ids -> (token_ids, scores)` for serving or benchmarks.

    Args:
        model: the `Transformer`.
        method: "beam", "greedy" or "sampling".
        jit_compile: compile the search with XLA (one compilation per input
            shape).
        with_target_prefix: the function takes a second input, the target
            prefixes `[B, P]` (`beam_search`'s `target_prefix`):
            `(source_ids, target_prefix) -> (token_ids, scores)`.
        **options: keyword arguments of `beam_search` / `greedy_search` / `sampling_search`
            (e.g. `beam_size=4, alpha=0.6, max_length=None`), but `target_prefix`.

    Returns:
        a `tf.function` with input signature `[None, None]` int32 (twice with
        `with_target_prefix`), suitable for `tf.saved_model.save` (attach it
        to a `tf.Module` that also tracks the model).

    Example:
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> translate = make_decode_fn(model, "beam", beam_size=4, alpha=0.6, max_length=8)
    >>> token_ids, scores = translate(tf.constant([[5, 6, 7, 3], [8, 9, 3, 0]]))
    >>> token_ids.dtype.name, token_ids.shape[1] <= 8, scores.shape.as_list()
    ('int32', True, [2])
    """
    return _make_decode_fn(lambda: model, method, jit_compile, options, with_target_prefix)


def _check_options(
    beam_size=1,
    alpha=0.0,
    max_length=None,
    min_length=0,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    max_extra_length=EXTRA_OUTPUT_LENGTH,
    early_stopping=DEFAULT_EARLY_STOPPING,
    temperature=1.0,
    top_k=0,
    seed=None,
    no_repeat_ngram_size=0,
    length_penalty=DEFAULT_LENGTH_PENALTY,
    **_,
):
    # It divides float32 log-probabilities: below float32's smallest normal number, CPUs flush it to 0.
    if not np.finfo(np.float32).tiny <= float(temperature) < float("inf"):
        raise ValueError(f"temperature must be finite and at least 1.2e-38 (float32's tiny), got {temperature!r}.")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise ValueError(f"top_k must be a non-negative integer, got {top_k!r}.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be None or an integer, got {seed!r}.")
    check_length_penalty(length_penalty)
    check_early_stopping(early_stopping)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be a positive integer, got {beam_size!r}.")
    check_alpha(alpha)
    if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1):
        raise ValueError(f"max_length must be None or a positive integer, got {max_length!r}.")
    if isinstance(max_extra_length, bool) or not isinstance(max_extra_length, int) or max_extra_length < 1:
        raise ValueError(f"max_extra_length must be a positive integer, got {max_extra_length!r}.")
    if isinstance(min_length, bool) or not isinstance(min_length, int) or min_length < 0:
        raise ValueError(f"min_length must be a non-negative integer, got {min_length!r}.")
    if isinstance(no_repeat_ngram_size, bool) or not isinstance(no_repeat_ngram_size, int) or no_repeat_ngram_size < 0:
        raise ParameterError(
            "no_repeat_ngram_size", f"must be a non-negative integer (0: off), got {no_repeat_ngram_size!r}."
        )
    for name, value in (("bos_id", bos_id), ("eos_id", eos_id)):
        if isinstance(value, bool) or not isinstance(value, int) or value == PAD_ID:
            raise ValueError(f"{name} must be an integer token id other than the pad id 0, got {value!r}.")


# Graph functions built for eager calls, per model (weakly) and options.
_EAGER_FUNCTIONS = weakref.WeakKeyDictionary()


def _eager_call(model, method, source_ids, options, target_prefix=None):
    functions = _EAGER_FUNCTIONS.setdefault(model, {})
    prefixed = target_prefix is not None
    key = (method, prefixed, tuple(sorted(options.items())))
    if key not in functions:
        model_ref = weakref.ref(model)  # the cache must not keep the model alive
        functions[key] = _make_decode_fn(model_ref, method, False, options, prefixed)
    vocab_size = _checked_ids(model, source_ids, options)
    source_ids = tf.cast(source_ids, tf.int32)
    if not prefixed:
        return functions[key](source_ids)
    _, limits = output_limits(
        model, source_ids, options["max_length"], options.get("max_extra_length", EXTRA_OUTPUT_LENGTH)
    )
    check_target_prefix(target_prefix, limits, options.get("eos_id", EOS_ID), vocab_size)
    return functions[key](source_ids, tf.cast(target_prefix, tf.int32))


def _checked_ids(model, source_ids, options):
    """Refuses eager source ids outside the model's vocabulary (a gather would fail deep in the graph, or,
    for a negative id, read another token's row), a row of padding only (its output would be the model's
    guess from nothing) and start/end ids outside the vocabulary; returns the vocabulary size (None for a
    model without `config.vocab_size`: unchecked)."""
    vocab_size = getattr(getattr(model, "config", None), "vocab_size", None)
    if vocab_size is None:
        return None
    for name in ("bos_id", "eos_id"):
        value = options.get(name, BOS_ID if name == "bos_id" else EOS_ID)
        if not 0 <= value < vocab_size:
            raise ParameterError(name, f"must be below the model's vocab_size {vocab_size}, got {value}.")
    ids = np.asarray(source_ids)
    if ids.ndim != 2:
        raise ParameterError("source_ids", f"must be a [batch, length] array, got shape {ids.shape}.")
    empty = (ids == PAD_ID).all(axis=-1)  # every row of a [B, 0] array too
    if empty.any():
        raise ParameterError("source_ids", f"row {int(np.argmax(empty))} has no token: there is nothing to translate.")
    refuse_bad_ids("source_ids", ids, (ids < 0) | (ids >= vocab_size), f" is not in [0, {vocab_size}).")
    return vocab_size


def _make_decode_fn(get_model, method, jit_compile, options, with_target_prefix=False):
    searches = {"beam": beam_search, "greedy": greedy_search, "sampling": sampling_search}
    if method not in searches:
        raise ValueError(f"method must be one of {', '.join(searches)}, got {method!r}.")
    search = searches[method]
    # The prefixes are an input of the function (`with_target_prefix`), not an option fixed in it.
    allowed = set(inspect.signature(search).parameters) - {"target_prefix"}
    unknown = sorted(set(options) - allowed - {"model", "source_ids"})
    if unknown:
        raise TypeError(f"{search.__name__} has no option(s) {', '.join(unknown)}.")
    _check_options(**options)
    signature = [tf.TensorSpec([None, None], tf.int32, name="source_ids")]
    # No autograph: the search is explicit TensorFlow control flow already.
    if with_target_prefix:
        signature.append(tf.TensorSpec([None, None], tf.int32, name="target_prefix"))

        @tf.function(input_signature=signature, jit_compile=bool(jit_compile), autograph=False)
        def decode_with_prefix(source_ids, target_prefix):
            return search(get_model(), source_ids, target_prefix=target_prefix, **options)

        return decode_with_prefix

    @tf.function(input_signature=signature, jit_compile=bool(jit_compile), autograph=False)
    def decode(source_ids):
        return search(get_model(), source_ids, **options)

    return decode
