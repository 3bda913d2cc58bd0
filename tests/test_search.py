"""Greedy and beam search (keras_transformer.decoding) on tiny models.

Decoding functions called eagerly build one graph per model and options, so
the fixtures below share results between tests to keep tracing cheap.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.decoding import beam_search, greedy_search, length_penalty, make_decode_fn

BOS, EOS = 2, 3


def tiny_model(vocab_size, d_model=32, seed=0):
    keras.utils.set_random_seed(seed)
    config = TransformerConfig.tiny(
        vocab_size=vocab_size, num_layers=2, d_model=d_model, num_heads=4, d_ff=2 * d_model, dropout=0.0
    )
    model = Transformer(config)
    ids = np.full((1, 3), min(5, vocab_size - 1), np.int32)
    model((ids, ids))
    return model


def padded(rows, width=None):
    width = width or max(len(r) for r in rows)
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def unpad(row):
    """Output tokens of one hypothesis (trailing padding removed)."""
    row = np.asarray(row)
    return row[row != 0].tolist()


def source_lengths(source_ids):
    return (np.asarray(source_ids) != 0).sum(-1)


def check_well_formed(tokens, limit):
    """One hypothesis: padding only at the end; ends with EOS (once) or at its length limit."""
    seq = unpad(tokens)
    assert np.all(np.asarray(tokens)[len(seq) :] == 0) and 0 not in seq
    assert len(seq) <= limit
    if EOS in seq:
        assert seq.index(EOS) == len(seq) - 1
    else:
        assert len(seq) == limit


def teacher_forced_log_prob(model, source, tokens):
    """Sum of the model's log-probabilities of `tokens` given `source` (full forward pass)."""
    target_in = np.array([[BOS] + tokens[:-1]], np.int32)
    logits = model((np.asarray(source, np.int32)[None], target_in))
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    return float(sum(log_probs[t, tok] for t, tok in enumerate(tokens)))


# ----------------------------------------------------------------------------------
# A random model
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def random_model():
    # A small vocabulary so that a random model emits EOS now and then.
    return tiny_model(vocab_size=12, seed=0)


@pytest.fixture(scope="module")
def sources():
    rng = np.random.default_rng(0)
    lengths = [1, 9, 3, 17, 6, 12]
    return padded([rng.integers(4, 12, size=n) for n in lengths])


@pytest.fixture(scope="module")
def random_results(random_model, sources):
    """Cached and uncached greedy and (return_all) beam results on the random model."""
    results = {}
    for use_cache in (True, False):
        results["greedy", use_cache] = greedy_search(random_model, sources, use_cache=use_cache)
        results["beam", use_cache] = beam_search(random_model, sources, return_all=True, use_cache=use_cache)
    return {key: tuple(t.numpy() for t in value) for key, value in results.items()}


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_cached_decoding_matches_uncached(random_results, method):
    cached_ids, cached_scores = random_results[method, True]
    uncached_ids, uncached_scores = random_results[method, False]
    np.testing.assert_array_equal(cached_ids, uncached_ids)
    np.testing.assert_allclose(cached_scores, uncached_scores, rtol=1e-5, atol=1e-5)


def test_output_format_and_dtypes(random_model, sources, random_results):
    ids, scores = beam_search(random_model, sources)
    assert ids.dtype == tf.int32 and scores.dtype == tf.float32
    assert ids.shape[0] == len(sources) and scores.shape == (len(sources),)
    # The default result is the best of return_all.
    all_ids, all_scores = random_results["beam", True]
    assert all_ids.ndim == 3 and all_ids.shape[:2] == (len(sources), 4) and all_scores.shape == (len(sources), 4)
    np.testing.assert_array_equal(ids.numpy(), all_ids[:, 0, : ids.shape[1]])
    np.testing.assert_allclose(scores.numpy(), all_scores[:, 0], rtol=1e-6)
    # Trimmed to the longest output; the model produced at least one EOS.
    assert ids.shape[1] == max(len(unpad(r)) for r in ids.numpy())
    assert any(EOS in unpad(r) for r in all_ids.reshape(-1, all_ids.shape[-1]))


def test_beam_hypotheses_sorted_complete_and_scored(random_model, sources, random_results):
    ids, scores = random_results["beam", True]  # [B, K, L], [B, K]
    assert np.all(np.diff(scores, axis=1) <= 0)
    limits = source_lengths(sources) + 50
    for b in range(len(sources)):
        seqs = [tuple(unpad(h)) for h in ids[b]]
        assert len(set(seqs)) == len(seqs)  # K distinct hypotheses
        for k in range(ids.shape[1]):
            check_well_formed(ids[b, k], limits[b])
            # The score is the model's log-probability over the GNMT penalty (alpha=0.6).
            tokens = unpad(ids[b, k])
            expected = teacher_forced_log_prob(random_model, sources[b], tokens) / float(
                length_penalty(len(tokens), 0.6)
            )
            np.testing.assert_allclose(scores[b, k], expected, rtol=1e-4, atol=1e-4)


def test_greedy_output_and_score(random_model, sources, random_results):
    ids, scores = random_results["greedy", True]
    limits = source_lengths(sources) + 50
    for b in range(len(sources)):
        check_well_formed(ids[b], limits[b])
        tokens = unpad(ids[b])
        np.testing.assert_allclose(
            scores[b], teacher_forced_log_prob(random_model, sources[b], tokens), rtol=1e-4, atol=1e-4
        )


def test_beam_size_one_is_greedy(random_model, sources, random_results):
    greedy_ids, greedy_scores = random_results["greedy", True]
    ids, scores = beam_search(random_model, sources, beam_size=1, alpha=0.0)
    np.testing.assert_array_equal(ids.numpy(), greedy_ids[:, : ids.shape[1]])
    np.testing.assert_allclose(scores.numpy(), greedy_scores, rtol=1e-5)


def test_max_length_bounds_output(random_model, sources):
    ids, _ = beam_search(random_model, sources, max_length=5, return_all=True)
    assert ids.shape[-1] <= 5
    for hypothesis in ids.numpy().reshape(-1, ids.shape[-1]):
        check_well_formed(hypothesis, 5)


def test_default_max_length_is_source_length_plus_50_per_sentence(random_model, sources):
    # min_length beyond every limit forbids EOS: every output runs to its own limit.
    ids, _ = greedy_search(random_model, sources, min_length=1000)
    lengths = [len(unpad(r)) for r in ids.numpy()]
    assert lengths == (source_lengths(sources) + 50).tolist()
    assert EOS not in ids.numpy()
    ids, _ = greedy_search(random_model, sources, min_length=1000, max_extra_length=3)
    assert [len(unpad(r)) for r in ids.numpy()] == (source_lengths(sources) + 3).tolist()


def test_batch_decodes_like_single_sentences(random_model, sources, random_results):
    """Sentences of lengths 1..17 in one padded batch decode as they do alone."""
    for method in ("greedy", "beam"):
        batch_ids, batch_scores = random_results[method, True]
        for b in range(len(sources)):
            alone = sources[b : b + 1, : source_lengths(sources)[b]]  # no padding at all
            if method == "greedy":
                ids, scores = greedy_search(random_model, alone)
            else:
                ids, scores = beam_search(random_model, alone, return_all=True)
            ids, scores = ids.numpy()[0], scores.numpy()[0]
            assert [unpad(h) for h in np.reshape(ids, (-1, ids.shape[-1]))] == [
                unpad(h) for h in np.reshape(batch_ids[b], (-1, batch_ids.shape[-1]))
            ]
            np.testing.assert_allclose(scores, batch_scores[b], rtol=1e-5, atol=1e-5)


def test_jit_compile_matches_graph(random_model, sources, random_results):
    decode = make_decode_fn(random_model, "beam", beam_size=4, alpha=0.6, return_all=True, jit_compile=True)
    ids, scores = decode(tf.constant(sources))
    expected_ids, expected_scores = random_results["beam", True]
    np.testing.assert_array_equal(ids.numpy(), expected_ids)
    np.testing.assert_allclose(scores.numpy(), expected_scores, rtol=1e-4, atol=1e-4)


def test_jit_compile_does_not_specialize_on_the_input_values(random_model, sources):
    """XLA compiles the search once per input shape: no input value becomes a compile-time constant.

    (Step 0 run outside the while loop once made the source ids constants,
    and XLA compiled the search again at every call.)
    """
    decode = make_decode_fn(random_model, "beam", beam_size=2, alpha=0.6, jit_compile=True)
    first = tf.constant(sources)
    second = tf.constant(np.where(sources > 0, 15 - sources, 0).astype(np.int32))  # same shape and padding
    hlo = [decode.experimental_get_compiler_ir(x)(stage="hlo") for x in (first, second)]
    assert hlo[0] == hlo[1]


def test_decode_fn_exports_in_a_saved_model(random_model, sources, tmp_path):
    module = tf.Module()
    module.weights = list(random_model.weights)  # the variables the function captures
    module.translate = make_decode_fn(random_model, "beam", beam_size=2, max_length=6)
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.translate})
    loaded = tf.saved_model.load(str(tmp_path))
    expected_ids, expected_scores = module.translate(tf.constant(sources))
    assert expected_ids.shape[-1] <= 6
    outputs = loaded.signatures["serving_default"](source_ids=tf.constant(sources))
    ids, scores = outputs["output_0"], outputs["output_1"]
    np.testing.assert_array_equal(ids.numpy(), expected_ids.numpy())
    np.testing.assert_allclose(scores.numpy(), expected_scores.numpy(), rtol=1e-6)


# ----------------------------------------------------------------------------------
# A handcrafted model whose probabilities we choose
# ----------------------------------------------------------------------------------


class ScriptedModel:
    """A stand-in for `Transformer`: P(next token) depends only on the previous token and the step.

    Tokens: 0 pad, 1 unk, 2 bos, 3 eos, 4 "a", 5 "b". From the start:
    P(eos) = 0.30, P(a) = 0.28, P(b) = P(unk) = 0.2. After "a": "a" again
    with 0.95 until 4 tokens, then eos with 0.95. After "b"/"unk": eos 0.9.

        [eos]            log P = -1.204                      len 1
        [a, a, a, a, eos]  log P = log .28 + 4 log .95 = -1.478  len 5

    Raw log-probability prefers [eos]; with alpha = 0.6, lp(5) = (10/6)^0.6
    = 1.359 and -1.478 / 1.359 = -1.088 > -1.204 prefers the long one.
    """

    vocab_size = 6

    def __init__(self, positions=64):
        probs = np.full((self.vocab_size, positions, self.vocab_size), 1e-4)
        probs[BOS, :, [EOS, 4, 5, 1]] = [[0.30], [0.28], [0.2], [0.2]]
        probs[4, :4, 4] = 0.95
        probs[4, 4:, EOS] = 0.95
        for previous in (1, 5, EOS, 0):
            probs[previous, :, EOS] = 0.9
        self.probs = probs / probs.sum(-1, keepdims=True)
        self.table = tf.constant(np.log(self.probs), tf.float32)  # [previous, step, next]
        self.steps = tf.Variable(0)  # decoder steps run, to observe early stopping

    def log_prob(self, tokens):
        return float(sum(np.log(self.probs[prev, t, tok]) for t, (prev, tok) in enumerate(zip([BOS] + tokens, tokens))))

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [2]], 0))

    def init_cache(self, memory, max_length):
        batch = tf.shape(memory)[0]
        return {"self": [(tf.zeros([batch, 1, max_length, 2]),) * 2], "cross": [(memory, memory)]}

    def decode_step(self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None):
        self.steps.assign_add(1)
        if positions is None:
            positions = cache_index + tf.range(tf.shape(target_ids)[1])
        steps = positions + tf.zeros_like(target_ids)
        return tf.gather_nd(self.table, tf.stack([target_ids, steps], -1)), cache

    def decode(self, target_ids, memory, source_ids, training=None):
        self.steps.assign_add(1)
        steps = tf.range(tf.shape(target_ids)[1])[None, :] + tf.zeros_like(target_ids)
        return tf.gather_nd(self.table, tf.stack([target_ids, steps], -1))


@pytest.mark.parametrize("use_cache", [True, False])
def test_length_penalty_changes_the_chosen_hypothesis(use_cache):
    model = ScriptedModel()
    source = np.array([[7, 7, 7]], np.int32)
    ids, scores = beam_search(model, source, beam_size=2, alpha=0.0, use_cache=use_cache)
    assert unpad(ids[0]) == [EOS]
    np.testing.assert_allclose(scores[0], model.log_prob([EOS]), rtol=1e-5)

    ids, scores = beam_search(model, source, beam_size=2, alpha=0.6, use_cache=use_cache)
    assert unpad(ids[0]) == [4, 4, 4, 4, EOS]
    long = model.log_prob([4, 4, 4, 4, EOS])
    assert long < model.log_prob([EOS]) < long / (10 / 6) ** 0.6
    np.testing.assert_allclose(scores[0], long / (10 / 6) ** 0.6, rtol=1e-5)

    # Greedy takes the locally best first token.
    ids, _ = greedy_search(model, source, use_cache=use_cache)
    assert unpad(ids[0]) == [EOS]


def test_a_translators_one_best_at_beam_size_1_is_its_greedy_translation(spm500):
    """`translate(n_best=1)` and `translate()` agree at beam size 1 (the SavedModel's two signatures too):
    a beam of one searching on past its first end token would find [a, a, a, a, eos] here, not [eos]."""
    import types

    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.inference.translator import Translator

    model = ScriptedModel()
    model.config = types.SimpleNamespace(positional_encoding="sinusoidal", max_length=64, vocab_size=6)
    translator = Translator(model, Tokenizer(spm500), beam_size=1, alpha=0.6, max_extra_length=8)
    texts, scores = translator.translate(["A dog.", "Two men."], return_scores=True)
    assert texts == ["", ""]  # [eos]
    n_best = translator.translate(["A dog.", "Two men."], n_best=1)
    assert n_best == [[(text, pytest.approx(score))] for text, score in zip(texts, scores)]


def test_search_stops_early():
    """The loop ends as soon as no alive hypothesis can beat the best finished one."""
    model = ScriptedModel()
    source = np.array([[7, 7, 7]], np.int32)
    # alpha = 0: after step 1, [eos] (log .30) beats the best alive [a] (log .28).
    model.steps.assign(0)
    beam_search(model, source, beam_size=2, alpha=0.0)
    assert int(model.steps.numpy()) == 1
    model.steps.assign(0)
    greedy_search(model, source)
    assert int(model.steps.numpy()) == 1
    # alpha = 0.6: [a, a, a, a, eos] wins at step 5; alive hypotheses fall below
    # the bound a few steps later, long before the limit of 3 + 50 tokens.
    model.steps.assign(0)
    beam_search(model, source, beam_size=2, alpha=0.6)
    assert 5 <= int(model.steps.numpy()) < 10


def test_k_finished_stops_when_k_hypotheses_have_ended():
    """fairseq's rule: done once K hypotheses ended, even if an alive one could still win."""
    model = ScriptedModel()
    source = np.array([[7, 7, 7]], np.int32)
    model.steps.assign(0)
    ids, scores = beam_search(model, source, beam_size=2, alpha=0.6, early_stopping="k_finished")
    # Step 1 ends [eos]; step 2 ends [b, eos] (or [x, eos]): two finished, stop.
    # The exact search goes on and finds [a, a, a, a, eos] at step 5.
    assert int(model.steps.numpy()) == 2
    assert unpad(ids[0]) == [EOS]
    np.testing.assert_allclose(scores[0], model.log_prob([EOS]), rtol=1e-5)
    ids, _ = beam_search(model, source, beam_size=2, alpha=0.6, early_stopping="exact")
    assert unpad(ids[0]) == [4, 4, 4, 4, EOS]


class SourceLengthModel:
    """A stand-in whose sentences end after as many tokens as their source has: "a" until then, then eos.

    Counts the hypothesis rows each decoder step computes (`rows`).
    """

    vocab_size = 6

    def __init__(self):
        self.rows = tf.Variable(0)

    encode = ScriptedModel.encode
    init_cache = ScriptedModel.init_cache

    def decode_step(self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None):
        self.rows.assign_add(tf.size(target_ids))
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, 0), tf.int32), axis=1)  # [B]
        step = positions[None, :] + tf.zeros_like(target_ids)  # [B, K]
        ends = tf.equal(step + 1, lengths[:, None])[..., None]  # [B, K, 1]
        token = tf.range(self.vocab_size)
        logits = tf.where(ends, tf.where(tf.equal(token, EOS), 5.0, 0.0), tf.where(tf.equal(token, 4), 5.0, 0.0))
        return logits, cache


def test_finished_sentences_leave_the_batch():
    """Once the short sentences are done, each step computes the long one's K rows only; results unchanged."""
    model = SourceLengthModel()
    sources = padded([[7, 7]] * 7 + [[7] * 12])  # 7 sentences that end at step 2, one at step 12
    k = 2
    model.rows.assign(0)
    ids, scores = beam_search(model, sources, beam_size=k, alpha=0.6)
    rows = int(model.rows.numpy())
    steps = 12 + 4  # the long sentence's steps, and a few more until no alive hypothesis can win
    assert rows < 8 * k * 4 + k * steps, rows  # the whole batch for the first steps only
    assert rows >= k * 12
    for i, source in enumerate(sources):
        alone_ids, alone_scores = beam_search(model, source[None, : (12 if i == 7 else 2)], beam_size=k, alpha=0.6)
        assert unpad(ids[i]) == unpad(alone_ids[0]) == [4] * (11 if i == 7 else 1) + [EOS]
        np.testing.assert_allclose(scores[i], alone_scores[0], atol=2e-6)


class FirstStepRowsModel(SourceLengthModel):
    """Also counts the rows of the decoder call at cache slot 0, the first step (`first_rows`)."""

    def __init__(self):
        super().__init__()
        self.first_rows = tf.Variable(0)

    def decode_step(self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None):
        self.first_rows.assign_add(tf.where(tf.equal(cache_index, 0), tf.size(target_ids), 0))
        return super().decode_step(target_ids, memory, source_ids, cache, cache_index, positions, self_attention_mask)


def test_first_step_computes_one_hypothesis_per_sentence():
    """At step 0 the K hypotheses are all the start token: one row per sentence is computed, not K."""
    model = FirstStepRowsModel()
    sources = padded([[7, 7, 7]] * 3)
    k = 4
    ids, _ = beam_search(model, sources, beam_size=k, alpha=0.6)
    assert int(model.first_rows.numpy()) == 3  # K times fewer than the other steps'
    assert int(model.rows.numpy()) % k == 3  # every later step computes K rows per sentence
    assert [unpad(row) for row in ids.numpy()] == [[4, 4, EOS]] * 3


def test_first_step_state_equals_a_full_step_zero(random_model, sources):
    """The one computed row, copied K times, gives the logits and cache that computing all K would."""
    from keras_transformer.decoding.steps import make_step_fn

    k, buffer_length = 3, 6

    @tf.function
    def both(source_ids):
        step = make_step_fn(
            random_model, random_model.encode(source_ids), source_ids, buffer_length, BOS, use_cache=True, beam_size=k
        )
        assert step.has_first  # a plain graph
        token_ids = tf.zeros([tf.shape(source_ids)[0], k, buffer_length], tf.int32)
        return step(tf.constant(0), token_ids, step.initial_state), step.first(token_ids, step.initial_state)

    (full_logits, full_state), (first_logits, first_state) = both(tf.constant(sources))
    assert first_logits.shape[1] == 1  # the one row; top_tokens copies its candidates
    for beam in range(k):
        np.testing.assert_allclose(first_logits.numpy()[:, 0], full_logits.numpy()[:, beam], rtol=1e-5, atol=1e-5)
    full_cache, full_ancestry, _ = full_state
    first_cache, first_ancestry, _ = first_state
    np.testing.assert_array_equal(first_ancestry.numpy(), full_ancestry.numpy())
    for first, full in zip(tf.nest.flatten(first_cache), tf.nest.flatten(full_cache)):
        assert first.shape == full.shape
        np.testing.assert_allclose(first.numpy(), full.numpy(), rtol=1e-5, atol=1e-5)


def test_first_step_attention_is_no_softmax_over_one_value():
    """Step 0's self-attention has one key; Keras would warn at every search built if it ran a softmax over it."""
    import warnings

    model = tiny_model(vocab_size=12, seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ids, _ = beam_search(model, padded([[4, 5, 6]]), beam_size=2)
    assert ids.shape[0] == 1
    assert not [w for w in caught if "softmax" in str(w.message)], [str(w.message) for w in caught]


def test_finished_sentences_leave_the_batch_in_greedy_search():
    model = SourceLengthModel()
    sources = padded([[7, 7]] * 7 + [[7] * 12])
    model.rows.assign(0)
    ids, scores = greedy_search(model, sources)
    rows = int(model.rows.numpy())
    assert 12 <= rows < 8 * 3 + 12, rows  # 8 rows for the first steps, then the long sentence's alone
    for i, source in enumerate(sources):
        alone_ids, alone_scores = greedy_search(model, source[None, : (12 if i == 7 else 2)])
        assert unpad(ids[i]) == unpad(alone_ids[0]) == [4] * (11 if i == 7 else 1) + [EOS]
        np.testing.assert_allclose(scores[i], alone_scores[0], atol=2e-6)


@pytest.mark.parametrize("vocab_size, k", [(8000, 10), (8000, 8), (1200, 9), (7919, 10), (50, 10)])
def test_blocked_top_k_equals_top_k(vocab_size, k):
    """The block-maximum top-k is exact, also with ties (rounded values) and when it falls back."""
    from keras_transformer.decoding.tokens import blocked_top_k as _blocked_top_k

    rng = np.random.default_rng(vocab_size + k)
    x = np.round(rng.normal(size=(3, 4, vocab_size)) * 4).astype("float32")  # many ties
    x[0, 0, -k:] = 100.0  # the top k in the last block
    values, ids = _blocked_top_k(tf.constant(x), k)
    expected, _ = tf.math.top_k(x, k)
    np.testing.assert_array_equal(values.numpy(), expected.numpy())
    np.testing.assert_array_equal(np.take_along_axis(x, ids.numpy(), axis=-1), values.numpy())
    assert all(len(set(row)) == k for row in ids.numpy().reshape(-1, k))


@pytest.mark.parametrize("vocab_size, k", [(8000, 10), (8000, 8), (1200, 9), (7919, 10)])
def test_strided_top_k_equals_top_k_in_bfloat16(vocab_size, k):
    """The strided-block top-k of bfloat16 logits is exact in the values, also with ties, and its ids point at them."""
    from keras_transformer.decoding.tokens import strided_top_k

    rng = np.random.default_rng(vocab_size + k)
    x = np.round(rng.normal(size=(3, 4, vocab_size)) * 4).astype("float32")  # many ties
    x[0, 0, -k:] = 100.0  # the top k in the last strided blocks
    x[1, 2, ::97] = 50.0  # many equal maxima, spread over the blocks
    x_bf16 = tf.constant(x, tf.bfloat16)
    values, ids = strided_top_k(x_bf16, k)
    assert values.dtype == tf.bfloat16
    expected, _ = tf.math.top_k(x, k)
    np.testing.assert_array_equal(tf.cast(values, tf.float32).numpy(), expected.numpy())
    np.testing.assert_array_equal(np.take_along_axis(x, ids.numpy(), axis=-1), expected.numpy())
    assert all(len(set(row)) == k for row in ids.numpy().reshape(-1, k))


def test_top_allowed_tokens_of_bfloat16_logits_match_float32():
    """bfloat16 logits: the same allowed tokens (up to ties), float32 log-probabilities within 0.02 of a float32
    log-softmax of the same logits; pad never, the end token not before `min_length`."""
    from keras_transformer.decoding.tokens import top_allowed_tokens

    rng = np.random.default_rng(5)
    x = (rng.normal(size=(6, 4, 8000)) * 2.5).astype("float32")
    x[..., 10:15] += rng.uniform(4, 12, size=(6, 4, 5)).astype("float32")
    x[..., 0] = x[..., EOS] = 30.0  # both forbidden below, both the most probable
    x = tf.cast(tf.constant(x, tf.bfloat16), tf.float32).numpy()  # values a bfloat16 logit can take
    log_probs, ids = top_allowed_tokens(tf.constant(x, tf.bfloat16), 8, 0, 2, EOS)
    assert log_probs.dtype == tf.float32
    expected_log_probs, expected_ids = top_allowed_tokens(tf.constant(x), 8, 0, 2, EOS)
    reference = tf.nn.log_softmax(x).numpy()
    assert not np.isin(ids.numpy(), [0, EOS]).any()  # pad (0) and the end token
    np.testing.assert_array_equal(
        np.take_along_axis(x, ids.numpy(), -1), np.take_along_axis(x, expected_ids.numpy(), -1)
    )
    np.testing.assert_allclose(log_probs.numpy(), np.take_along_axis(reference, ids.numpy(), -1), atol=0.02)
    np.testing.assert_allclose(
        expected_log_probs.numpy(), np.take_along_axis(reference, expected_ids.numpy(), -1), atol=1e-5
    )


def test_bfloat16_search_takes_its_logits_in_bfloat16(monkeypatch):
    """In a plain graph a bfloat16 model's beam search projects to bfloat16 logits and searches them as they are;
    each sentence decodes in a batch as it does alone."""
    from keras_transformer.decoding import tokens

    seen = []
    original = tokens.strided_top_k

    def spy(x, k):
        seen.append(x.dtype)
        return original(x, k)

    monkeypatch.setattr(tokens, "strided_top_k", spy)
    model = tiny_model(1200)  # a vocabulary large enough for blocks (`block_size`)
    bf16 = Transformer(model.config, dtype="bfloat16")
    bf16.set_weights(model.get_weights())
    sources = padded([[5, 6, 7, 8], [9, 10], [11, 12, 13]])
    ids, scores = beam_search(bf16, sources, beam_size=4, max_length=6)
    assert seen and set(seen) == {tf.bfloat16}
    assert scores.dtype == tf.float32
    for b, length in enumerate((4, 2, 3)):
        alone_ids, alone_scores = beam_search(bf16, sources[b : b + 1, :length], beam_size=4, max_length=6)
        assert unpad(ids[b]) == unpad(alone_ids[0])
        np.testing.assert_allclose(scores[b], alone_scores[0], atol=1e-3)


def test_length_penalty_formula():
    np.testing.assert_allclose(length_penalty(1, 0.6), 1.0)
    np.testing.assert_allclose(length_penalty(7, 0.6), 2.0**0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.0), 1.0)
    np.testing.assert_allclose(length_penalty(7, 0.6, "average"), 7.0**0.6, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 1.0, "average"), 7.0, rtol=1e-6)
    np.testing.assert_allclose(length_penalty(7, 0.0, "average"), 1.0)
    with pytest.raises(ValueError, match="length_penalty must be one of gnmt, average, got 'fairseq'"):
        length_penalty(7, 1.0, "fairseq")


@pytest.mark.parametrize("use_cache", [True, False])
def test_average_length_penalty_ranks_by_log_prob_over_length(use_cache):
    """With alpha 0.08, GNMT's penalty keeps [eos]; dividing by |Y| ** 0.08 (fairseq's) prefers the long output."""
    model = ScriptedModel()
    source = np.array([[7, 7, 7]], np.int32)
    short, long = model.log_prob([EOS]), model.log_prob([4, 4, 4, 4, EOS])
    assert long / (10 / 6) ** 0.08 < short < long / 5**0.08
    ids, scores = beam_search(model, source, beam_size=2, alpha=0.08, use_cache=use_cache)
    assert unpad(ids[0]) == [EOS]
    ids, scores = beam_search(model, source, beam_size=2, alpha=0.08, use_cache=use_cache, length_penalty="average")
    assert unpad(ids[0]) == [4, 4, 4, 4, EOS]
    np.testing.assert_allclose(scores[0], long / 5**0.08, rtol=1e-5)


def test_average_length_penalty_scores_are_log_prob_over_length(random_model, sources):
    ids, scores = beam_search(random_model, sources, beam_size=3, alpha=1.0, return_all=True, length_penalty="average")
    for b in range(len(sources)):
        for k in range(ids.shape[1]):
            tokens = unpad(ids.numpy()[b, k])
            expected = teacher_forced_log_prob(random_model, sources[b], tokens) / len(tokens)
            np.testing.assert_allclose(scores.numpy()[b, k], expected, rtol=1e-4, atol=1e-4)


def test_invalid_options(random_model, sources):
    with pytest.raises(ValueError, match="beam_size"):
        beam_search(random_model, sources, beam_size=0)
    with pytest.raises(ValueError, match="max_length"):
        greedy_search(random_model, sources, max_length=0)
    with pytest.raises(ValueError, match="early_stopping"):
        beam_search(random_model, sources, early_stopping="never")
    with pytest.raises(ValueError, match="length_penalty must be one of gnmt, average"):
        beam_search(random_model, sources, length_penalty="fairseq")
    with pytest.raises(ValueError, match="method"):
        make_decode_fn(random_model, "sample")
    with pytest.raises(TypeError, match="beam_size"):
        make_decode_fn(random_model, "greedy", beam_size=4)
    with pytest.raises(ValueError, match="alpha must be >= 0 and finite"):
        beam_search(random_model, sources, alpha=float("inf"))


def test_ids_outside_the_vocabulary_are_refused_by_name_and_place(random_model, sources):
    """A gather would fail deep in the graph, or, for -1, silently read the last token's embedding; a row
    of padding only would decode the model's guess from nothing."""
    from keras_transformer.decoding import sampling_search
    from keras_transformer.errors import ParameterError

    for bad, where in ((12, "row 2, position 1: id 12"), (-1, "row 2, position 1: id -1")):
        broken = sources.copy()
        broken[2, 1] = bad
        for search in (greedy_search, beam_search, sampling_search):
            with pytest.raises(ParameterError, match=rf"^source_ids {where} is not in \[0, 12\)\.$"):
                search(random_model, broken)
    empty = sources.copy()
    empty[3] = 0
    with pytest.raises(ParameterError, match="^source_ids row 3 has no token: there is nothing to translate"):
        greedy_search(random_model, empty)
    with pytest.raises(ParameterError, match="^source_ids row 0 has no token"):
        beam_search(random_model, np.zeros((2, 0), np.int32))
    with pytest.raises(ParameterError, match="^eos_id must be below the model's vocab_size 12, got 99"):
        greedy_search(random_model, sources, eos_id=99)
    with pytest.raises(ParameterError, match="^bos_id must be below the model's vocab_size 12, got 12"):
        beam_search(random_model, sources, bos_id=12)
    prefix = np.zeros((len(sources), 2), np.int32)
    prefix[1, 1] = 12
    with pytest.raises(ParameterError, match=r"^target_prefix row 1, position 1: id 12; allowed: ids in \[0, 12\)"):
        beam_search(random_model, sources, target_prefix=prefix)


# ----------------------------------------------------------------------------------
# A model trained to copy its input
# ----------------------------------------------------------------------------------

COPY_VOCAB = 16


def copy_batch(n, rng, min_len=3, max_len=8):
    """Random sequences of tokens 4..15; the target is the same sequence."""
    rows = [rng.integers(4, COPY_VOCAB, size=rng.integers(min_len, max_len + 1)).tolist() for _ in range(n)]
    source = padded(rows, max_len)
    target_in = padded([[BOS] + r for r in rows], max_len + 1)
    target_out = padded([r + [EOS] for r in rows], max_len + 1)
    return source, target_in, target_out, rows


@pytest.fixture(scope="module")
def copy_model():
    model = tiny_model(COPY_VOCAB, d_model=32, seed=0)
    steps, batch = 500, 64
    source, target_in, target_out, _ = copy_batch(steps * batch, np.random.default_rng(0))
    schedule = keras.optimizers.schedules.PolynomialDecay(5e-3, steps, 2.5e-4)
    model.compile(optimizer=keras.optimizers.Adam(schedule, beta_2=0.98))
    model.fit((source, target_in), target_out, batch_size=batch, epochs=1, verbose=0)
    return model


def test_trained_copy_model_decodes_exactly(copy_model):
    source, _, _, rows = copy_batch(64, np.random.default_rng(1))
    ids, scores = beam_search(copy_model, source)
    decoded = [unpad(r) for r in ids.numpy()]
    exact = np.mean([d == r + [EOS] for d, r in zip(decoded, rows)])
    assert exact >= 0.95, f"only {exact:.0%} of held-out sequences copied exactly"

    # The same sentences one by one, and through the uncached reference.
    for b in (0, 1):
        alone, _ = beam_search(copy_model, source[b : b + 1, : len(rows[b])])
        assert unpad(alone[0]) == decoded[b]
    ref_ids, ref_scores = beam_search(copy_model, source[:8], use_cache=False)
    assert [unpad(r) for r in ref_ids.numpy()] == decoded[:8]
    np.testing.assert_allclose(ref_scores.numpy(), scores.numpy()[:8], rtol=1e-4, atol=1e-5)


def test_min_length_forbids_early_eos(copy_model):
    source, _, _, rows = copy_batch(8, np.random.default_rng(2), max_len=6)
    ids, _ = beam_search(copy_model, source, min_length=8)
    for row in ids.numpy():
        tokens = unpad(row)
        assert EOS not in tokens[:8]
        assert len(tokens) >= 8


def test_bfloat16_decoding_of_the_copy_model(copy_model):
    """The same weights under mixed_bfloat16 decode the same outputs, scores within 0.05 (documented)."""
    source, _, _, rows = copy_batch(32, np.random.default_rng(3))
    ids, scores = beam_search(copy_model, source)
    bf16 = Transformer(copy_model.config, dtype="mixed_bfloat16")
    bf16.set_weights(copy_model.get_weights())
    assert bf16.compute_dtype == "bfloat16"
    bf16_ids, bf16_scores = beam_search(bf16, source)
    assert [unpad(r) for r in bf16_ids.numpy()] == [unpad(r) for r in ids.numpy()]
    np.testing.assert_allclose(bf16_scores.numpy(), scores.numpy(), atol=0.05)


class ProjectionCountingModel(ScriptedModel):
    """A `ScriptedModel` that projects its decoder output on its own (`step_logits`) and counts the rows.

    Its "decoder output" is the logits themselves; `decoded_rows` counts the
    hypotheses each `decode_step` computes, `projected_rows` those projected.
    """

    def __init__(self):
        super().__init__()
        self.decoded_rows = tf.Variable(0)
        self.projected_rows = tf.Variable(0)

    def decode_step(
        self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None, project=True
    ):
        self.decoded_rows.assign_add(tf.size(target_ids))
        logits, cache = super().decode_step(
            target_ids, memory, source_ids, cache, cache_index, positions, self_attention_mask
        )
        return (self.step_logits(logits, cache) if project else logits), cache

    def step_logits(self, decoder_output, cache, dtype="float32"):
        self.projected_rows.assign_add(tf.reduce_prod(tf.shape(decoder_output)[:-1]))
        return decoder_output


@pytest.mark.parametrize("return_all", [False, True])
def test_hypotheses_that_cannot_change_the_result_are_not_projected(return_all):
    """Alive hypotheses whose bound cannot beat the finished score get no candidates: fewer rows, same results."""
    model = ProjectionCountingModel()
    # [eos] finishes at step 0 and [4, 4, 4, 4, eos] wins with alpha 0.6; the other hypotheses (log P about
    # log 1e-4 per extra token) soon cannot beat them.
    sources = padded([[7, 7, 7], [7, 7]])
    options = dict(beam_size=3, alpha=0.6, return_all=return_all)
    ids, scores = beam_search(model, sources, **options)
    reference_ids, reference_scores = beam_search(ScriptedModel(), sources, use_cache=False, **options)
    np.testing.assert_array_equal(ids.numpy(), reference_ids.numpy())
    np.testing.assert_allclose(scores.numpy(), reference_scores.numpy(), rtol=1e-6)
    projected, decoded = int(model.projected_rows.numpy()), int(model.decoded_rows.numpy())
    assert 0 < projected < decoded


def test_k_finished_stopping_projects_every_hypothesis():
    """With "k_finished" a hopeless hypothesis can still end a sentence (its K-th finish): all are projected."""
    model = ProjectionCountingModel()
    beam_search(model, padded([[7, 7, 7]]), beam_size=3, alpha=0.6, early_stopping="k_finished")
    assert int(model.projected_rows.numpy()) == int(model.decoded_rows.numpy()) > 0


class RandomTableModel(ProjectionCountingModel):
    """`ProjectionCountingModel` with a random, peaked table `P(next | previous, step)`, redrawn by `draw(seed)`."""

    vocab_size = 8

    def __init__(self):
        super().__init__()
        self.table = tf.Variable(tf.zeros([self.vocab_size, 64, self.vocab_size]))

    def draw(self, seed):
        rng = np.random.default_rng(seed)
        probs = rng.dirichlet(np.full(self.vocab_size, 0.3), size=(self.vocab_size, 64)) + 1e-6
        probs[..., EOS] += 0.15  # sentences end, at various lengths
        self.probs = probs / probs.sum(-1, keepdims=True)
        self.table.assign(np.log(self.probs).astype(np.float32))


@pytest.mark.parametrize(("alpha", "penalty"), [(0.0, "gnmt"), (1.0, "gnmt"), (1.0, "average")])
@pytest.mark.parametrize("return_all", [False, True])
def test_leaving_out_hypotheses_never_changes_a_search(return_all, alpha, penalty):
    """On random peaked models, the search that leaves out hopeless hypotheses equals the full reference one."""
    model = RandomTableModel()
    sources = padded([[7] * n for n in (1, 2, 4, 8)])  # different length limits, so different bounds
    options = dict(beam_size=3, alpha=alpha, return_all=return_all, length_penalty=penalty)
    for seed in range(8):
        model.draw(seed)
        ids, scores = beam_search(model, sources, **options)
        reference_ids, reference_scores = beam_search(model, sources, use_cache=False, **options)
        np.testing.assert_array_equal(ids.numpy(), reference_ids.numpy(), err_msg=f"seed {seed}")
        np.testing.assert_allclose(scores.numpy(), reference_scores.numpy(), rtol=1e-5, err_msg=f"seed {seed}")
    assert int(model.projected_rows.numpy()) < int(model.decoded_rows.numpy())  # some were left out
