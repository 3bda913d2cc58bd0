"""Sampling search and forced-decoding scores, against the searches they must agree with."""

import keras
import numpy as np
import pytest

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.decoding import beam_search, greedy_search, sampling_search, score_outputs

VOCAB = 40


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(5)
    model = Transformer(TransformerConfig.tiny(VOCAB, dropout=0.0, num_layers=1, d_model=32, d_ff=64))
    model.build()
    return model


def sources(seed=0, lengths=(5, 9, 3, 7)):
    rng = np.random.default_rng(seed)
    width = max(lengths)
    rows = [list(rng.integers(4, VOCAB, size=n)) + [3] + [0] * (width - n) for n in lengths]
    return np.array(rows, np.int32)


def test_forced_decoding_scores_equal_the_scores_beam_search_reports(model):
    """With the length penalty off, beam search's score of each hypothesis is its log P(Y | X)."""
    ids, scores = beam_search(model, sources(), beam_size=3, alpha=0.0, max_length=10, return_all=True)
    ids, scores = ids.numpy(), scores.numpy()  # [B, K, L], [B, K]
    batch, k, length = ids.shape
    repeated_sources = np.repeat(sources(), k, axis=0)
    log_probs, lengths = score_outputs(model, repeated_sources, ids.reshape(batch * k, length))
    np.testing.assert_allclose(log_probs.numpy().reshape(batch, k), scores, atol=1e-4)
    np.testing.assert_array_equal(lengths.numpy().reshape(batch, k), (ids != 0).sum(-1))


def test_forced_decoding_scores_greedy_outputs(model):
    ids, scores = greedy_search(model, sources(1), max_length=12)
    log_probs, _ = score_outputs(model, sources(1), ids)
    np.testing.assert_allclose(log_probs.numpy(), scores.numpy(), atol=1e-4)


def test_sampling_with_top_k_1_is_greedy_search(model):
    greedy_ids, greedy_scores = greedy_search(model, sources(), max_length=12)
    sampled_ids, sampled_scores = sampling_search(model, sources(), top_k=1, seed=1, max_length=12)
    np.testing.assert_array_equal(sampled_ids.numpy(), greedy_ids.numpy())
    np.testing.assert_allclose(sampled_scores.numpy(), greedy_scores.numpy(), atol=1e-5)


def test_sampling_draws_from_the_distribution_divided_by_the_temperature(model):
    """Near-zero temperatures sharpen each step's distribution to its best token: greedy search, whatever the
    seed. At temperature 1 the same seeds draw other tokens."""
    greedy_ids, _ = greedy_search(model, sources(), max_length=12)
    for seed in (1, 2):
        cold, _ = sampling_search(model, sources(), temperature=1e-6, seed=seed, max_length=12)
        np.testing.assert_array_equal(cold.numpy(), greedy_ids.numpy())
        warm, _ = sampling_search(model, sources(), temperature=1.0, seed=seed, max_length=12)
        assert not np.array_equal(warm.numpy(), greedy_ids.numpy())


def test_a_temperature_too_small_for_float32_still_draws_the_best_token(model):
    """At float32's smallest normal temperature every log-probability below -4 divided by it overflows to
    -inf, the best one too, unless the best is shifted to 0 first. A subnormal one is flushed to 0: refused."""
    keras.utils.set_random_seed(6)
    flat = Transformer(TransformerConfig.tiny(4000, dropout=0.0, num_layers=1, d_model=32, d_ff=64))  # best < -4
    greedy_ids, _ = greedy_search(flat, sources(), max_length=12)
    cold, _ = sampling_search(flat, sources(), temperature=float(np.finfo(np.float32).tiny), seed=1, max_length=12)
    np.testing.assert_array_equal(cold.numpy(), greedy_ids.numpy())
    with pytest.raises(ValueError, match=r"temperature must be finite and at least 1.2e-38 .*, got 1e-39"):
        sampling_search(model, sources(), temperature=1e-39)


def test_sampling_is_reproducible_for_a_seed_and_varies_with_it(model):
    src = np.repeat(sources(2, (6,)), 8, axis=0)  # one sentence, 8 draws
    first, _ = sampling_search(model, src, temperature=2.0, seed=7, max_length=10)
    again, _ = sampling_search(model, src, temperature=2.0, seed=7, max_length=10)
    other, _ = sampling_search(model, src, temperature=2.0, seed=8, max_length=10)
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert not np.array_equal(first.numpy(), other.numpy())
    # The rows of one call are different draws too, not one draw repeated.
    assert len({tuple(row) for row in first.numpy()}) > 1


def test_each_batch_draws_its_own_samples_for_a_seed(model):
    """The seed is keyed by the batch: the same 8 rows beside another sentence draw other samples, where a
    seed keyed by the row alone would give row r of every batch (every batch of a `translate`) the same
    numbers. The same batch draws the same samples, however far it is padded."""
    repeated = np.repeat(sources(2, (6,)), 8, axis=0)
    batches = [np.concatenate([repeated, sources(seed, (6,))]) for seed in (3, 4)]
    first, _ = sampling_search(model, batches[0], temperature=2.0, seed=7, max_length=10)
    second, _ = sampling_search(model, batches[1], temperature=2.0, seed=7, max_length=10)
    wider = np.pad(batches[0], ((0, 0), (0, 3)))  # the same batch padded further: the same samples
    again, _ = sampling_search(model, wider, temperature=2.0, seed=7, max_length=10)
    assert not np.array_equal(first.numpy()[:8], second.numpy()[:8])
    np.testing.assert_array_equal(first.numpy(), again.numpy())


def test_sampling_scores_are_the_models_log_probabilities_of_the_samples(model):
    ids, scores = sampling_search(model, sources(3), temperature=1.5, top_k=10, seed=3, max_length=10, min_length=2)
    ids = ids.numpy()
    assert (ids[:, :2] != 3).all() and (ids[:, :2] != 0).all()  # no end token, no padding before min_length
    log_probs, _ = score_outputs(model, sources(3), ids)
    np.testing.assert_allclose(log_probs.numpy(), scores.numpy(), atol=1e-4)


def test_top_k_restricts_the_draws(model):
    """With top_k = 2, every sampled token is one of the two most probable at its step."""
    src = sources(4, (5,))
    ids, _ = sampling_search(model, np.repeat(src, 6, axis=0), top_k=2, temperature=3.0, seed=2, max_length=6)
    for row in ids.numpy():
        prefix = [2]
        for token in row:
            if token == 0:
                break
            logits = model((src, np.array([prefix])), training=False)[0, -1].numpy()
            logits[0] = -np.inf  # padding is never generated
            assert token in np.argsort(logits)[-2:]
            prefix.append(int(token))


@pytest.mark.parametrize("bad", [dict(temperature=0.0), dict(temperature=float("inf")), dict(top_k=-1), dict(seed="x")])
def test_bad_sampling_options_are_refused(model, bad):
    with pytest.raises(ValueError):
        sampling_search(model, sources(), **bad)


def test_no_temperature_brings_forbidden_tokens_back(model):
    """Pad is never drawn and the end token not before min_length, however flat the temperature makes the rest."""
    src = np.repeat(sources(), 10, axis=0)
    ids, _ = sampling_search(model, src, temperature=1e9, seed=1, min_length=10, max_length=30)
    ids = ids.numpy()
    for row in ids:
        length = int(np.sum(row != 0))
        assert (row[:length] != 0).all() and (row[length:] == 0).all()  # no pad inside
        assert 3 not in row[:10]  # eos id 3: not among the first min_length tokens


@pytest.mark.parametrize("search", [greedy_search, beam_search, sampling_search])
def test_searches_of_one_output_token(model, search):
    """max_length=1 (a buffer of one position) decodes as the reference without cache."""
    ids, _ = search(model, sources(), max_length=1)
    reference, _ = search(
        model, sources(), max_length=1, use_cache=False, **({"seed": 3} if search is sampling_search else {})
    )
    if search is sampling_search:
        ids, _ = search(model, sources(), max_length=1, seed=3)
    assert ids.shape == (4, 1)
    np.testing.assert_array_equal(ids, reference)
