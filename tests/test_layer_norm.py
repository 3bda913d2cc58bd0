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
    for got, want, name in zip(
        _value_and_gradients(ours, x, upstream),
        _value_and_gradients(reference, x, upstream),
        ["y", "dx", "dgamma", "dbeta"],
    ):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=name)
    # The mean is removed exactly: shifting a row changes nothing, forward or backward.
    np.testing.assert_allclose(
        _value_and_gradients(ours, x + 100.0, upstream)[1], _value_and_gradients(ours, x, upstream)[1], atol=1e-3
    )


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
    float32_layer_norm = centered / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + 1e-6) * np.asarray(
        ours.gamma
    ) + np.asarray(ours.beta)
    np.testing.assert_allclose(np.asarray(tf.cast(ours(x), tf.float32)), float32_layer_norm, rtol=1e-2, atol=1e-2)
    for got, want, name in zip(
        _value_and_gradients(ours, x, upstream),
        _value_and_gradients(reference, x, upstream),
        ["y", "dx", "dgamma", "dbeta"],
    ):
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


def _graph_op_types(fn, spec):
    return {op.type for op in tf.function(fn).get_concrete_function(spec).graph.get_operations()}


def test_inference_form_is_used_only_in_graphs_without_gradients_where_onednn_fuses_it():
    from keras_transformer import compat

    layer, reference = _pair((2, 3, 16))
    spec = tf.TensorSpec([None, None, 16], tf.float32)
    fused = compat.onednn_kernels_enabled()
    assert ("FusedBatchNormV3" in _graph_op_types(lambda x: layer(x, training=False), spec)) == fused
    assert "FusedBatchNormV3" not in _graph_op_types(lambda x: layer(x, training=True), spec)

    def value_and_gradient(x):  # inference mode, but under a tape: the closed form and its gradient
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = layer(x, training=False)
        return y, tape.gradient(y, x, output_gradients=tf.ones_like(y) * tf.range(16, dtype=tf.float32))

    assert "FusedBatchNormV3" not in _graph_op_types(value_and_gradient, spec)
    x = np.random.default_rng(5).standard_normal((2, 3, 16)).astype("float32") * 4 + 2
    got = tf.function(value_and_gradient)(tf.constant(x))
    want = _value_and_gradients(reference, x, np.broadcast_to(np.arange(16, dtype="float32"), x.shape))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "mixed_bfloat16"])
def test_served_inference_runs_one_fused_kernel_with_the_closed_form_s_results(tmp_path, dtype):
    """As TF Serving runs an export (a session over the SavedModel's graph): with oneDNN, one `_MklLayerNorm` per
    layer norm and none of the closed form's ops; the results those of the closed form in float32 statistics."""
    from keras_transformer import compat

    layer, _ = _pair((4, 3, 16), dtype=dtype)
    module = tf.Module()
    module.weights = [weight.value for weight in layer.weights]  # the tf.Variables, for the SavedModel to restore
    module.serve = tf.function(
        lambda x: {"y": tf.cast(layer(x, training=False), tf.float32)},
        input_signature=[tf.TensorSpec([None, None, 16], layer.compute_dtype)],
    )
    tf.saved_model.save(module, str(tmp_path), signatures={"serving_default": module.serve})
    rng = np.random.default_rng(6)
    # A large offset and a small spread per row: float32 statistics keep the spread, bfloat16 sums would not.
    values = (30.0 + rng.standard_normal((4, 3, 16)) * rng.uniform(0.5, 4, (4, 3, 1))).astype("float32")
    x = np.asarray(tf.cast(tf.cast(values, layer.compute_dtype), tf.float32))  # what the layer is given

    graph = tf.Graph()
    with tf.compat.v1.Session(graph=graph) as session:
        signature = tf.compat.v1.saved_model.load(session, ["serve"], str(tmp_path)).signature_def["serving_default"]
        metadata = tf.compat.v1.RunMetadata()
        feed = x.astype(tf.as_dtype(layer.compute_dtype).as_numpy_dtype)
        y = session.run(
            signature.outputs["y"].name,
            {signature.inputs["x"].name: feed},
            options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
            run_metadata=metadata,
        )
    ran = {
        node.timeline_label.split("=", 1)[-1].split("(")[0].strip()
        for device in metadata.step_stats.dev_stats
        for node in device.node_stats
        if "=" in node.timeline_label
    }
    if compat.onednn_kernels_enabled():
        assert "_MklLayerNorm" in ran and not ran & {"Mean", "Rsqrt", "FusedBatchNormV3"}
    else:
        assert "_MklLayerNorm" not in ran and "Mean" in ran
    centered = x - x.mean(axis=-1, keepdims=True)
    gamma, beta = (np.asarray(tf.cast(w, tf.float32)) for w in (layer.gamma, layer.beta))
    want = centered / np.sqrt(np.mean(np.square(centered), axis=-1, keepdims=True) + 1e-6) * gamma + beta
    tolerance = 1e-4 if dtype == "float32" else 1e-2  # bfloat16: one rounding of the output
    np.testing.assert_allclose(y, want, rtol=tolerance, atol=tolerance)


def test_passes_the_keras_layer_test():
    """Build, config and serialization round trips, a training step, mixed_float16 output dtype = spec."""
    from keras.src import testing

    class Case(testing.TestCase):
        def runTest(self):
            self.run_layer_test(
                LayerNormalization,
                init_kwargs={"epsilon": 1e-6},
                input_shape=(2, 5, 8),
                expected_output_shape=(2, 5, 8),
                expected_num_trainable_weights=2,
                supports_masking=True,
            )

    Case().runTest()
