"""Every weight starts from its own random draw, with the initializer's statistics.

An unseeded Keras 3 initializer draws its seed once, when it is constructed,
and returns the same values at every call: a layer that made several weights
from one initializer instance started with W^Q = W^K = W^V = W^O in every
attention sublayer and with W_2 a reshaped W_1 in every feed-forward network.
These tests would have caught it.
"""

import functools
import hashlib
import itertools
import math

import keras
import numpy as np
import pytest

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.config import PRESETS
from keras_transformer.layers import (
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    SharedEmbedding,
)

VOCAB = 1000
SEED = 2024  # not conftest's 1234, so that no build here repeats another test's stream


def build(preset, seed=None):
    """The `{path: values}` of a freshly built preset model; `seed=None` continues the current stream."""
    if seed is not None:
        keras.utils.set_random_seed(seed)
    model = Transformer(TransformerConfig.from_preset(preset, vocab_size=VOCAB))
    # Paths without the model's own name, which is unique per model ("transformer_3/...").
    return {w.path.split("/", 1)[1]: np.asarray(w) for w in model.weights}


@functools.cache
def seeded_weights(preset):
    return build(preset, SEED)


def digests(weights):
    return {path: hashlib.blake2b(values.tobytes(), digest_size=16).hexdigest() for path, values in weights.items()}


def matrices(weights):
    return {path: values for path, values in weights.items() if values.ndim >= 2}


def identical_pairs(arrays):
    """Pairs of names whose arrays hold the same multiset of values (same sorted flattened values)."""
    by_size = {}
    for name, values in arrays.items():
        by_size.setdefault(values.size, []).append(name)
    pairs = []
    for names in by_size.values():
        if len(names) < 2:
            continue
        sorted_values = {name: np.sort(arrays[name], axis=None) for name in names}
        buckets = {}  # a hash first: all pairs of one size would be 1,770 comparisons for base
        for name in names:
            buckets.setdefault(hashlib.blake2b(sorted_values[name].tobytes()).digest(), []).append(name)
        for bucket in buckets.values():
            pairs += [
                (a, b)
                for a, b in itertools.combinations(bucket, 2)
                if np.array_equal(sorted_values[a], sorted_values[b])
            ]
    return pairs


# The preset models -------------------------------------------------------------


@pytest.mark.parametrize("preset", PRESETS)
def test_no_two_weight_matrices_start_equal(preset):
    """(a) All rank >= 2 variables of equal size differ as multisets (W_1 vs W_2 included)."""
    weights = matrices(seeded_weights(preset))
    assert identical_pairs(weights) == []


def expected_distribution(path, values, d_model):
    """The initializer's distribution ("uniform" or "normal") and stddev for a kernel of the model, or None."""
    name = path.rsplit("/", 1)[-1]
    attention_kernel = name in ("query_kernel", "key_kernel", "value_kernel", "output_kernel")
    feed_forward_kernel = "/feed_forward/" in path and name == "kernel"
    if attention_kernel or feed_forward_kernel:
        fan_in, fan_out = values.shape  # Glorot uniform: U(-l, l), l = sqrt(6 / (fan_in + fan_out))
        return "uniform", np.sqrt(2.0 / (fan_in + fan_out))
    if name == "embeddings":
        return "normal", d_model**-0.5  # normal, stddev d_model^-0.5 (SharedEmbedding)
    return None


NORMAL_SHARE_BEYOND_2_STDDEV = math.erfc(2 / math.sqrt(2))  # 4.55%


@pytest.mark.parametrize("preset", PRESETS)
def test_kernel_statistics_match_their_initializers(preset):
    """(b) Attention and feed-forward kernels are Glorot uniform, the embedding normal(0, d_model^-0.5).

    The stddev and mean, and the shape of the distribution: Glorot normal and a uniform embedding of the
    same stddev have the same first two moments.
    """
    d_model = TransformerConfig.from_preset(preset, vocab_size=VOCAB).d_model
    checked = 0
    for path, values in matrices(seeded_weights(preset)).items():
        expected = expected_distribution(path, values, d_model)
        assert expected is not None, f"no expected statistics for {path}: add them here"
        distribution, stddev = expected
        assert abs(values.std() / stddev - 1.0) < 0.2, (path, values.std(), stddev)
        assert abs(values.mean()) < 0.2 * stddev, (path, values.mean())
        largest = np.abs(values).max()
        if distribution == "uniform":
            # U(-l, l), l = sqrt(3) stddev: nothing beyond l (Glorot normal, truncated at 2.27 stddev, has some),
            # and the largest of n draws falls short of 0.99 l with probability 0.99^n (< 1e-17 for the
            # smallest kernel, d_model^2 = 4,096 values).
            limit = math.sqrt(3.0) * stddev
            assert 0.99**values.size < 1e-12, (path, values.size)
            assert largest <= limit * (1 + 1e-6), (path, largest, limit)
            assert largest > 0.99 * limit, (path, largest, limit)
        else:
            # N(0, stddev): 4.55% beyond 2 stddev; a uniform of that stddev ends at sqrt(3) stddev, with none.
            # For n values the share's own stddev is sqrt(0.0455 * 0.9545 / n) < 0.001 (n >= 64,000 here).
            share = np.mean(np.abs(values) > 2 * stddev)
            assert abs(share - NORMAL_SHARE_BEYOND_2_STDDEV) < 0.01, (path, share)
        checked += 1
    c = TransformerConfig.from_preset(preset, vocab_size=VOCAB)
    assert checked == 1 + c.num_layers * (6 + 10)  # embedding; 4 + 2 per encoder, 8 + 2 per decoder layer


@pytest.mark.parametrize("preset", PRESETS)
def test_same_seed_same_weights_otherwise_different(preset):
    """(c) `set_random_seed(s)` fixes every weight; another seed, or none, changes every matrix."""
    reference_weights = seeded_weights(preset)
    reference = digests(reference_weights)
    assert digests(build(preset, SEED)) == reference
    other_seed = digests(build(preset, SEED + 1))
    unseeded = digests(build(preset))  # continues the stream: no seed set in between
    for path in matrices(reference_weights):
        assert other_seed[path] != reference[path], path
        assert unseeded[path] != other_seed[path], path


# The layers ----------------------------------------------------------------------


def sorted_values(variable):
    return np.sort(np.asarray(variable), axis=None)


def all_distinct(variables):
    values = [sorted_values(v) for v in variables]
    return all(not np.array_equal(a, b) for a, b in itertools.combinations(values, 2))


INITIALIZERS = {
    "by name": lambda: "glorot_uniform",
    "unseeded instance": lambda: keras.initializers.GlorotUniform(),
    "int seed": lambda: keras.initializers.GlorotUniform(seed=7),
    "seed generator": lambda: keras.initializers.GlorotUniform(seed=keras.random.SeedGenerator(7)),
}


@pytest.mark.parametrize("make_initializer", INITIALIZERS.values(), ids=INITIALIZERS.keys())
def test_attention_projections_start_different(make_initializer):
    layer = MultiHeadAttention(
        4, 4, use_bias=True, kernel_initializer=make_initializer(), bias_initializer="random_normal"
    )
    layer.build((None, None, 16))
    assert all_distinct([layer.query_kernel, layer.key_kernel, layer.value_kernel, layer.output_kernel])
    assert all_distinct([layer.query_bias, layer.key_bias, layer.value_bias, layer.output_bias])
    config = layer.get_config()
    assert MultiHeadAttention.from_config(config).get_config() == config


@pytest.mark.parametrize("make_initializer", INITIALIZERS.values(), ids=INITIALIZERS.keys())
def test_feed_forward_matrices_start_different(make_initializer):
    layer = FeedForward(d_ff=32, kernel_initializer=make_initializer())
    layer.build((None, None, 16))
    assert all_distinct([layer.inner.kernel, layer.outer.kernel])  # same size, different shapes
    config = layer.get_config()
    assert FeedForward.from_config(config).get_config() == config


def test_config_keeps_the_users_initializer_not_a_per_weight_copy():
    """The config serializes what the user passed: unseeded stays unseeded, a seed stays that seed."""
    for seed in (None, 7):
        initializer = keras.initializers.GlorotUniform(seed=seed)
        attention = MultiHeadAttention(2, 4, kernel_initializer=initializer)
        attention.build((None, None, 8))
        feed_forward = FeedForward(8, kernel_initializer=initializer)
        feed_forward.build((None, None, 8))
        expected = keras.initializers.serialize(initializer)
        assert expected["config"]["seed"] == seed
        assert attention.get_config()["kernel_initializer"] == expected
        assert feed_forward.get_config()["kernel_initializer"] == expected


def test_int_seeded_initializer_is_reproducible():
    def kernels():
        layer = MultiHeadAttention(2, 4, kernel_initializer=keras.initializers.GlorotUniform(seed=7))
        layer.build((None, None, 8))
        return [np.asarray(w) for w in layer.weights]

    for a, b in zip(kernels(), kernels()):
        np.testing.assert_array_equal(a, b)


def test_one_initializer_instance_shared_by_layers_gives_each_its_own_values():
    initializer = keras.initializers.RandomNormal(stddev=0.1)
    embeddings = [SharedEmbedding(50, 8, embeddings_initializer=initializer) for _ in range(2)]
    positions = [LearnedPositionalEmbedding(50, initializer=initializer) for _ in range(2)]
    for layer in embeddings + positions:
        layer.build((None, None, 8))
    assert all_distinct([layer.weights[0] for layer in embeddings + positions])
