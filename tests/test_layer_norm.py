"""LayerNormalization: the closed-form gradient equals autodiff of Keras' layer norm."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.layers import LayerNormalization


def _pair(shape, dtype="float32", **kwargs):
    """Ours and Keras' layer norm with the same random (not 1 / 0) gamma and beta."""
    ours = LayerNormalization(epsilon=1e-6, dtype=dtype, **kwargs)
    reference = keras.layers.LayerNormalization(epsilon=1e-6, dtype=dtype, **kwargs)
    ours.build(shape)
    reference.build(shape)
    rng = np.random.default_rng(0)
    weights = [1.0 + 0.3 * rng.standard_normal(w.shape).astype("float32") for w in reference.weights]
    reference.set_weights(weights)
    ours.set_weights(weights)  # same weights, same names: checkpoints load either way
    return ours, reference


def _value_and_gradients(layer, x, upstream):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    gradients = tape.gradient(y, [x, *layer.trainable_weights], output_gradients=tf.cast(upstream, y.dtype))
    return [np.asarray(tf.cast(t, tf.float32)) for t in (y, *gradients)]


def test_outputs_and_all_gradients_equal_keras_layer_norm():
    rng = np.random.default_rng(1)
    # An offset and a spread per row, so the mean and variance terms of the gradient both matter.
    x = (3.0 + rng.standard_normal((2, 5, 16)) * rng.uniform(0.1, 10, (2, 5, 1))).astype("float32")
    upstream = rng.standard_normal(x.shape).astype("float32")
    ours, reference = _pair(x.shape)
    assert ours._closed_form
    for got, want, name in zip(_value_and_gradients(ours, x, upstream),
                               _value_and_gradients(reference, x, upstream), ["y", "dx", "dgamma", "dbeta"]):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    # The mean is removed exactly: shifting a row changes nothing, forward or backward.
    np.testing.assert_allclose(_value_and_gradients(ours, x + 100.0, upstream)[1],
                               _value_and_gradients(ours, x, upstream)[1], atol=1e-3)


def test_mixed_bfloat16_computes_in_float32_and_returns_bfloat16():
    """bf16 inputs are normalized with float32 statistics, and the output is bf16.

    Rows of 64 + 0.5 k (k in 0..15) are exact in bf16 (its spacing in [64, 128) is 0.5), but a row's bf16 sum
    (about 2,300, where the spacing is 16) and so its mean and variance are not: statistics in bf16 are off
    by ~0.17 in the output, float32 ones by at most bf16's rounding of the output (< 0.4%).
    """
    rng = np.random.default_rng(2)
    values = (64.0 + 0.5 * rng.integers(0, 16, (3, 4, 32))).astype("float32")
    x = tf.constant(values, tf.bfloat16)
    assert np.array_equal(np.asarray(tf.cast(x, tf.float32)), values)  # the inputs themselves lose nothing
    upstream = rng.standard_normal(values.shape).astype("float32")
    ours, reference = _pair(values.shape, dtype="mixed_bfloat16")
    assert ours(x).dtype == "bfloat16" and ours.gamma.dtype == "float32"
    centered = values - values.mean(axis=-1, keepdims=True)
    float32_layer_norm = (centered / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + 1e-6)
                          * np.asarray(ours.gamma) + np.asarray(ours.beta))
    np.testing.assert_allclose(np.asarray(tf.cast(ours(x), tf.float32)), float32_layer_norm, rtol=1e-2, atol=1e-2)
    for got, want, name in zip(_value_and_gradients(ours, x, upstream),
                               _value_and_gradients(reference, x, upstream), ["y", "dx", "dgamma", "dbeta"]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2, err_msg=name)


def test_float64_stays_float64():
    x = np.random.default_rng(4).standard_normal((2, 3, 8))
    ours, reference = _pair(x.shape, dtype="float64")
    assert ours(x).dtype == "float64"
    np.testing.assert_allclose(np.asarray(ours(x)), np.asarray(reference(x)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kwargs", [dict(axis=1), dict(center=False), dict(scale=False)])
def test_other_configurations_fall_back_to_keras(kwargs):
    x = np.random.default_rng(3).standard_normal((2, 6, 8)).astype("float32")
    upstream = np.ones_like(x)
    ours, reference = _pair(x.shape, **kwargs)
    assert not ours._closed_form
    for got, want in zip(_value_and_gradients(ours, x, upstream), _value_and_gradients(reference, x, upstream)):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_serializes_as_itself():
    layer = LayerNormalization(epsilon=1e-6, name="norm")
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is LayerNormalization
    assert restored.get_config() == layer.get_config()
