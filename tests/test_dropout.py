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


@pytest.mark.parametrize(
    "rate, shape, bits",
    [
        (0.3, _SHAPE, 16),  # [..., D / 2] numbers, two decisions each
        (0.1, (4096, 1023), 16),  # odd width: the flattened draw
        (0.002, _SHAPE, 32),  # within 2^-8 of 0: 16 bits would round the rate by 0.2%+
        (0.9999, _SHAPE, 32),  # ... or of 1
    ],
)
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


# P_drop and the attention-weight rate differ, and neither is 0: a dropout given the other's rate shows.
_MODEL_CONFIG = TransformerConfig(
    vocab_size=50, num_layers=1, d_model=16, num_heads=2, d_ff=32, dropout=0.3, attention_dropout=0.1
)


def _dropouts_and_their_rates(model, config):
    """`{id: (layer, rate)}` for every dropout of the model, with the rate its config gives it:
    P_drop on the sums of embeddings and positions and on every sublayer output (§5.4), the
    attention dropout on the attention weights."""
    from keras_transformer.layers.attention import MultiHeadAttention
    from keras_transformer.layers.sublayer import SublayerConnection

    layers = list(model._flatten_layers())
    residuals = [layer.residual_dropout for layer in layers if isinstance(layer, SublayerConnection)]
    attentions = [layer.dropout_layer for layer in layers if isinstance(layer, MultiHeadAttention)]
    # encoder: 2 residuals, 1 attention; decoder: 3 residuals, 2 attentions
    assert (len(residuals), len(attentions)) == (2 + 3, 1 + 2)
    expected = [(model.source_dropout, config.dropout), (model.target_dropout, config.dropout)]
    expected += [(layer, config.dropout) for layer in residuals]
    expected += [(layer, config.attention_dropout) for layer in attentions]
    return {id(layer): (layer, rate) for layer, rate in expected}


def test_every_dropout_of_the_model_is_exact_and_has_the_rate_of_its_config():
    """Every dropout of the model is ours, and has the rate of the config it was built from:
    P_drop (§5.4) for the embedding sums and the residuals, attention_dropout for the weights."""
    model = Transformer(_MODEL_CONFIG)
    model((np.ones((1, 3), "int32"), np.ones((1, 3), "int32")))
    dropouts = [layer for layer in model._flatten_layers() if isinstance(layer, keras.layers.Dropout)]
    # the 2 embedding sums; encoder: attention weights, 2 residuals; decoder: 2 attentions' weights, 3 residuals
    assert len(dropouts) == 2 + 3 + 5
    assert all(type(layer) is Dropout for layer in dropouts)
    expected = _dropouts_and_their_rates(model, _MODEL_CONFIG)
    assert set(expected) == {id(layer) for layer in dropouts}
    assert {layer.name: layer.rate for layer, _ in expected.values()} == {
        layer.name: rate for layer, rate in expected.values()
    }


def test_every_dropout_of_the_model_drops_its_rate_in_training_and_nothing_at_inference(monkeypatch):
    """The wiring: a model call with training=True reaches every dropout with training on, and
    each drops the share its config gives it (the residual dropouts too, which no other output
    would show with the embedding dropouts random); training=False drops nothing, and is
    deterministic where training=True is not."""
    calls = []  # (layer, inputs, outputs) of every dropout call
    original = Dropout.call

    def recording_call(self, inputs, training=False):
        outputs = original(self, inputs, training=training)
        calls.append((self, np.asarray(tf.cast(inputs, tf.float32)), np.asarray(tf.cast(outputs, tf.float32))))
        return outputs

    monkeypatch.setattr(Dropout, "call", recording_call)
    model = Transformer(_MODEL_CONFIG)
    expected = _dropouts_and_their_rates(model, _MODEL_CONFIG)
    rng = np.random.default_rng(0)
    # 64 x 24 tokens: 24576 values per embedding or residual dropout, the dropped share's sd 0.003 at 0.3
    inputs = tuple(rng.integers(4, _MODEL_CONFIG.vocab_size, (64, 24)).astype("int32") for _ in range(2))

    calls.clear()
    first = np.asarray(model(inputs, training=True))
    assert {id(layer) for layer, _, _ in calls} == set(expected) and len(calls) == len(expected)
    for layer, x, y in calls:
        rate = expected[id(layer)][1]
        live = x != 0  # the attention weights of masked positions are 0 already
        share = float(np.mean(y[live] == 0))
        assert share == pytest.approx(rate, abs=4 * np.sqrt(rate * (1 - rate) / live.sum())), layer.name
        np.testing.assert_allclose(y[live & (y != 0)], x[live & (y != 0)] / (1 - rate), rtol=1e-3)

    calls.clear()
    inference = np.asarray(model(inputs, training=False))
    assert len(calls) == len(expected)
    for layer, x, y in calls:
        np.testing.assert_array_equal(y, x, err_msg=layer.name)
    np.testing.assert_array_equal(np.asarray(model(inputs, training=False)), inference)
    second = np.asarray(model(inputs, training=True))
    assert not np.allclose(first, second) and not np.allclose(first, inference)


def test_every_dropout_s_output_is_what_the_model_goes_on_with(monkeypatch):
    """The wiring, from the other side: the output of every dropout (not only its call) reaches the model's
    output. One dropout at a time drops everything while the others pass their inputs through; the logits
    must change each time. A dropout computed and then left unused (a residual added without it, attention
    weights used before it) would keep them."""
    target = {"id": None}

    def one_dropout_drops_all(self, inputs, training=False):
        return tf.zeros_like(inputs) if training and id(self) == target["id"] else inputs

    monkeypatch.setattr(Dropout, "call", one_dropout_drops_all)
    model = Transformer(_MODEL_CONFIG)
    expected = _dropouts_and_their_rates(model, _MODEL_CONFIG)
    rng = np.random.default_rng(1)
    inputs = tuple(rng.integers(4, _MODEL_CONFIG.vocab_size, (2, 6)).astype("int32") for _ in range(2))
    unchanged = np.asarray(model(inputs, training=True))
    for layer_id, (layer, _) in expected.items():
        target["id"] = layer_id
        assert not np.allclose(np.asarray(model(inputs, training=True)), unchanged, atol=1e-4), layer.name


def test_passes_the_keras_layer_test():
    """Build, config and serialization round trips, a training step, mixed_float16 output dtype = spec."""
    from keras.src import testing

    class Case(testing.TestCase):
        def runTest(self):
            self.run_layer_test(
                Dropout,
                init_kwargs={"rate": 0.3, "seed": 1},
                input_shape=(2, 5, 8),
                call_kwargs={"training": True},
                expected_output_shape=(2, 5, 8),
                expected_num_trainable_weights=0,
                expected_num_seed_generators=1,
                supports_masking=True,
                run_training_check=False,  # no weights to train
            )

    Case().runTest()
