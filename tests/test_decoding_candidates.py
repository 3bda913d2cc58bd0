"""Steps 1-2 of beam search (`decoding.candidates`): each sentence's best candidates, found per sentence, are
those found hypothesis by hypothesis."""

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.decoding import candidates
from keras_transformer.decoding.defaults import NEG_INF

EOS = 3


def _logits(dtype, seed=0, batch=5, beams=4, vocab_size=8000):
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(batch, beams, vocab_size)) * 2.5).astype("float32")
    x[..., 10:15] += rng.uniform(4, 12, size=(batch, beams, 5)).astype("float32")  # a few likely tokens
    x[0, :, 0] = 40.0  # pad, the most probable token of sentence 0's hypotheses
    x[1, :, EOS] = 40.0  # the end token, sentence 1's
    x[2, beams - 1, 7::320] = 30.0  # many equal maxima
    return tf.constant(x, dtype)


def _alive(batch=5, beams=4, seed=1):
    alive = -np.sort(np.random.default_rng(seed).uniform(0.5, 6.0, (batch, beams)), axis=1).astype("float32")
    alive[3, 3] = NEG_INF  # a hypothesis the last step could not fill
    return tf.constant(alive)


def _search(logits, alive, min_length, live, per_sentence, monkeypatch):
    """`top_candidates` of `logits` in a plain graph, per sentence or (no blocks) hypothesis by hypothesis."""
    with monkeypatch.context() as patch:
        if not per_sentence:
            patch.setattr(candidates, "strided_blocks", lambda vocab_size, k: None)
        spy = []
        original = candidates._sentence_candidates
        patch.setattr(candidates, "_sentence_candidates", lambda *args: spy.append(1) or original(*args))
        search = tf.function(lambda: candidates.top_candidates(logits, None, alive, 8, 1, min_length, EOS, live))
        result = [t.numpy() for t in search()]
    assert bool(spy) == per_sentence
    return result


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("min_length", [0, 3])
@pytest.mark.parametrize("with_live", [False, True])
def test_candidates_per_sentence_are_those_per_hypothesis(monkeypatch, dtype, min_length, with_live):
    logits, alive = _logits(dtype), _alive()
    live = None
    if with_live:  # hypotheses 2-3 of sentence 0 left out; sentence 4 has none (it is done)
        mask = np.ones((5, 4), bool)
        mask[0, 2:] = False
        mask[4] = False
        live = tf.constant(mask)
    scores, beams, tokens = _search(logits, alive, min_length, live, True, monkeypatch)
    expected_scores, expected_beams, expected_tokens = _search(logits, alive, min_length, live, False, monkeypatch)
    kept = slice(0, 4) if with_live else slice(None)  # sentence 4 has no candidates either way
    np.testing.assert_array_equal(scores[kept], expected_scores[kept])  # exact, also with bfloat16's ties
    if with_live:
        assert (scores[4] < NEG_INF / 2).all() and (expected_scores[4] < NEG_INF / 2).all()
        assert not np.isin(beams[0], [2, 3]).any()
    assert not np.isin(tokens[kept], [0] + ([EOS] if min_length else [])).any()  # pad never, EOS not yet
    if min_length == 0:
        assert (tokens[1, :4] == EOS).all()  # allowed at once: every hypothesis's best
    for b in range(4 if with_live else 5):
        assert len({(k, t) for k, t in zip(beams[b], tokens[b])}) == 8  # eight different candidates
    # Each candidate's score is its hypothesis's log P plus its token's log-probability (float32 log-softmax of
    # the same logits; bfloat16's softmax is within 0.02).
    log_softmax = _log_softmax(tf.cast(logits, tf.float32).numpy())
    n = 4 if with_live else 5
    b = np.arange(n)[:, None]
    want = alive.numpy()[b, beams[:n]] + log_softmax[b, beams[:n], tokens[:n]]
    np.testing.assert_allclose(scores[:n], want, atol=1e-4 if dtype == tf.float32 else 0.02)
    if dtype == tf.float32:  # no ties but in sentence 2 (25 equal maxima): the same candidates in the same order
        untied = [0, 1, 3] + ([] if with_live else [4])
        np.testing.assert_array_equal(beams[untied], expected_beams[untied])
        np.testing.assert_array_equal(tokens[untied], expected_tokens[untied])


def _log_softmax(x):
    top = x.max(-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(-1, keepdims=True))


def test_one_hypothesis_per_sentence_as_at_step_0(monkeypatch):
    """Step 0 searches one row per sentence: every candidate extends hypothesis 0."""
    logits, alive = _logits(tf.bfloat16, batch=3, beams=1), tf.zeros([3, 1])
    scores, beams, tokens = _search(logits, alive, 0, None, True, monkeypatch)
    expected = _search(logits, alive, 0, None, False, monkeypatch)
    np.testing.assert_array_equal(scores, expected[0])
    assert (beams == 0).all() and scores.shape == (3, 8)


def test_small_vocabularies_and_xla_search_hypothesis_by_hypothesis():
    """Without blocks (a vocabulary under 64 entries per block kept) or under XLA: per hypothesis, same results."""
    logits, alive = _logits(tf.float32, vocab_size=200), _alive()
    plain = tf.function(lambda: candidates.top_candidates(logits, None, alive, 8, 1, 0, EOS))()
    logits_8000 = _logits(tf.float32)
    compiled = tf.function(lambda: candidates.top_candidates(logits_8000, None, alive, 8, 1, 0, EOS),
                           jit_compile=True)()
    graph = tf.function(lambda: candidates.top_candidates(logits_8000, None, alive, 8, 1, 0, EOS))()
    np.testing.assert_allclose(compiled[0].numpy(), graph[0].numpy(), atol=1e-5)  # XLA's logsumexp rounds its own way
    untied = [0, 1, 3, 4]
    for got, want in zip(compiled[1:], graph[1:]):
        np.testing.assert_array_equal(got.numpy()[untied], want.numpy()[untied])
    log_softmax = _log_softmax(logits.numpy())
    b = np.arange(5)[:, None]
    scores, beams, tokens = (t.numpy() for t in plain)
    np.testing.assert_allclose(scores, alive.numpy()[b, beams] + log_softmax[b, beams, tokens], atol=1e-4)
