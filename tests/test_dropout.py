"""Dropout: the rate it is given is the rate it drops, in float32 and bfloat16, forward and backward."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.layers import Dropout

# 2^22 draws: the dropped share's standard deviation at rate 0.1 is 1.5e-4.
_SHAPE = (1024, 4096)


def _dropped_share(layer, shape=_SHAPE):
    y = layer(tf.ones(shape, layer.compute_dtype), training=True)
    return float(np.mean(np.asarray(tf.cast(y, tf.float32)) == 0.0))


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16", "bfloat16", "mixed_float16"])
def test_drops_its_rate_in_every_dtype(policy):
    # Keras' own dropout drops 10.15% at rate 0.1 when it computes in bfloat16
    # (its uniform numbers have 8 significant bits): 10 standard deviations off.
    for seed in range(3):
        layer = Dropout(0.1, seed=seed, dtype=policy)
        assert _dropped_share(layer) == pytest.approx(0.1, abs=6e-4)


def _kept_share(rate, bits):
    return 1 - round(rate * 2**bits) / 2**bits


@pytest.mark.parametrize("rate, shape, bits", [
    (0.3, _SHAPE, 16),  # [..., D / 2] numbers, two decisions each
    (0.1, (4096, 1023), 16),  # odd width: the flattened draw
    (0.002, _SHAPE, 32),  # within 2^-8 of 0: 16 bits would round the rate by 0.2%+
    (0.9999, _SHAPE, 32),  # ... or of 1
])
def test_drops_its_rate_and_scales_by_the_kept_share_on_every_path(rate, shape, bits):
    y = np.asarray(Dropout(rate, seed=0)(tf.ones(shape), training=True))
    share = float(np.mean(y == 0.0))
    assert share == pytest.approx(rate, abs=4 * np.sqrt(rate * (1 - rate) / np.prod(shape)))
    # The scale tells the paths apart: 1 / the share the path keeps, to the float32 bit.
    np.testing.assert_array_equal(np.unique(y[y != 0]), [np.float32(1 / _kept_share(rate, bits))])


@pytest.mark.parametrize("shape", [(2048, 2048), (2048, 2047)])
def test_the_two_decisions_of_one_random_number_are_independent(shape):
    y = np.asarray(Dropout(0.3, seed=0)(tf.ones(shape), training=True)).reshape(-1)
    pairs = y[: y.size // 2 * 2].reshape(-1, 2) == 0  # elements 2i and 2i + 1 share a 32-bit number
    assert np.mean(pairs.all(axis=1)) == pytest.approx(0.09, abs=1e-3)  # 0.3^2, not 0.3


def test_unknown_static_shape_and_scalar():
    layer = Dropout(0.1, seed=0)
    fn = tf.function(lambda x: layer(x, training=True), input_signature=[tf.TensorSpec([None, None])])
    assert float(np.mean(np.asarray(fn(tf.ones(_SHAPE))) == 0)) == pytest.approx(0.1, abs=6e-4)
    values = {float(Dropout(0.5, seed=seed)(tf.constant(3.0), training=True)) for seed in range(8)}
    assert values == {0.0, 6.0}


def test_kept_values_are_scaled_to_keep_the_expectation():
    x = tf.random.stateless_normal((512, 256), seed=(1, 2))
    y = np.asarray(Dropout(0.25, seed=0)(x, training=True))
    kept = y != 0
    np.testing.assert_allclose(y[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
    ones = np.asarray(Dropout(0.25, seed=1)(tf.ones(_SHAPE), training=True))
    assert ones.mean() == pytest.approx(1.0, abs=2e-3)


def test_gradient_is_the_same_mask():
    layer = Dropout(0.4, seed=3)
    x = tf.random.stateless_normal((64, 32), seed=(3, 4))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x, training=True)
    gradient = np.asarray(tape.gradient(y, x))
    # 0.4 is drawn as 26214 / 2^16: kept values are scaled by 1 / (1 - 26214 / 2^16), 1 / 0.6 to 1e-5.
    np.testing.assert_allclose(gradient, np.where(np.asarray(y) != 0, 1 / (1 - 26214 / 2**16), 0.0), rtol=1e-6)


def test_identity_at_inference_and_rate_zero():
    x = tf.random.stateless_normal((8, 16), seed=(5, 6))
    np.testing.assert_array_equal(Dropout(0.5)(x, training=False), x)
    np.testing.assert_array_equal(Dropout(0.0)(x, training=True), x)
    np.testing.assert_array_equal(Dropout(1.0)(x, training=True), np.zeros_like(x))


def test_masks_differ_between_calls_and_repeat_with_the_seed():
    x = tf.ones((64, 64))
    first, second = Dropout(0.5, seed=7), Dropout(0.5, seed=7)
    a, b = np.asarray(first(x, training=True)), np.asarray(first(x, training=True))
    assert not np.array_equal(a, b)  # the seed generator advances
    np.testing.assert_array_equal(a, np.asarray(second(x, training=True)))


def test_noise_shape_is_keras_behaviour():
    y = np.asarray(Dropout(0.5, noise_shape=(None, 1), seed=0)(tf.ones((256, 8)), training=True))
    assert np.all((y == 0).all(axis=1) | (y != 0).all(axis=1))  # whole rows kept or dropped
    assert 0 < (y == 0).mean() < 1


def test_compiled_by_xla():
    layer = Dropout(0.1, seed=0, dtype="mixed_bfloat16")
    fn = tf.function(lambda x: layer(x, training=True), jit_compile=True)
    y = np.asarray(fn(tf.ones(_SHAPE, tf.bfloat16)).numpy().astype(np.float32))
    assert np.mean(y == 0) == pytest.approx(0.1, abs=6e-4)


def test_config_round_trip_and_serialization():
    layer = Dropout(0.2, seed=4, name="residual_dropout")
    clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(clone) is Dropout and clone.rate == 0.2 and clone.seed == 4


def test_every_dropout_of_the_model_is_exact():
    config = TransformerConfig(vocab_size=50, num_layers=1, d_model=16, num_heads=2, d_ff=32,
                               attention_dropout=0.1)
    model = Transformer(config)
    model((np.ones((1, 3), "int32"), np.ones((1, 3), "int32")))
    dropouts = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dropout)]
    # the 2 embedding sums; encoder: attention weights, 2 residuals; decoder: 2 attentions' weights, 3 residuals
    assert len(dropouts) == 2 + 3 + 5
    assert all(type(layer) is Dropout for layer in dropouts)
