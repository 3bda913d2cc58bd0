"""The kernel forms of `keras_transformer.kernels` equal the plain forms the layers show, in value and gradient."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer import compat
from keras_transformer.kernels import dropout as dropout_kernels
from keras_transformer.kernels import layer_norm as layer_norm_kernels
from keras_transformer.kernels.matmul import apply_to_rows, position_wise_matmul
from keras_transformer.layers.layer_norm import standardize

# matmul: position-wise matmuls on the [B*T, D] rows equal ops.matmul -------------------------------------------


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (2, 3, 2, 4), (0, 3, 4), (1, 0, 4)], ids=str)
def test_position_wise_matmul_equals_matmul_at_every_position(shape):
    x = np.random.default_rng(9).normal(size=shape).astype("float32")
    kernel = np.random.default_rng(10).normal(size=(4, 3)).astype("float32")
    out = np.asarray(position_wise_matmul(ops.convert_to_tensor(x), ops.convert_to_tensor(kernel)))
    assert out.shape == shape[:-1] + (3,)
    np.testing.assert_allclose(out, x @ kernel, atol=1e-5)
    # Heads merged: [B, T, N, H] @ [N*H, E], as multi-head attention's W^O.
    heads = x.reshape(shape[:-1] + (2, 2))
    merged = np.asarray(position_wise_matmul(ops.convert_to_tensor(heads), ops.convert_to_tensor(kernel), 2))
    np.testing.assert_allclose(merged, x @ kernel, atol=1e-5)


SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "Prod"}  # tf.tensordot's among them


@pytest.mark.parametrize(
    "signature, merged_axes, runs, reads_shapes",
    [
        ([None, 4, 8], 1, [[3, 4, 8], [0, 4, 8]], False),  # a decoding step's [B, K, D]
        ([None, 4, 2, 4], 2, [[3, 4, 2, 4], [0, 4, 2, 4]], False),  # its [B, K, N, H] before W^O
        ([2, None, 8], 1, [[2, 5, 8], [2, 0, 8]], False),
        ([None, None, 8], 1, [[2, 5, 8], [0, 3, 8]], True),
        ([None, 0, 8], 1, [[2, 0, 8]], True),
    ],
    ids=str,
)
def test_position_wise_matmul_reads_shapes_only_when_two_axes_are_unknown(signature, merged_axes, runs, reads_shapes):
    """One unknown axis is left to the reshape (-1): in a decoding step no shape op runs."""
    import tensorflow as tf

    kernel = tf.constant(np.random.default_rng(11).normal(size=(8, 3)).astype("float32"))
    traced = tf.function(
        lambda x: position_wise_matmul(x, kernel, merged_axes), input_signature=[tf.TensorSpec(signature)]
    )
    op_types = {op.type for op in traced.get_concrete_function().graph.get_operations()}
    assert bool(op_types & SHAPE_OPS) == reads_shapes, op_types & SHAPE_OPS
    assert "Prod" not in op_types  # never tf.tensordot
    for shape in runs:
        x = np.random.default_rng(12).normal(size=shape).astype("float32")
        out = np.asarray(traced(x))
        assert out.shape == tuple(shape[:-merged_axes]) + (3,)
        np.testing.assert_allclose(out, x.reshape(out.shape[:-1] + (8,)) @ np.asarray(kernel), atol=1e-5)


def test_position_wise_matmul_refuses_a_kernel_of_another_width():
    """A -1 in the reshape would otherwise cut the rows anew and return a wrong shape without an error."""
    import tensorflow as tf

    kernel = tf.zeros([6, 2])
    traced = tf.function(lambda x: position_wise_matmul(x, kernel), input_signature=[tf.TensorSpec([None, 3, 4])])
    with pytest.raises(ValueError, match=r"\(None, 3, 4\).*\(6, 2\)"):
        traced.get_concrete_function()


def test_position_wise_matmul_of_symbolic_and_unknown_rank_inputs():
    import tensorflow as tf

    kernel = np.ones((8, 3), "float32")
    for shape in [(None, 5, 8), (None, None, 8), (None, 0, 8)]:
        assert position_wise_matmul(keras.KerasTensor(shape), kernel).shape == shape[:-1] + (3,)
        assert position_wise_matmul(keras.KerasTensor(shape[:-1] + (2, 4)), kernel, 2).shape == shape[:-1] + (3,)
    traced = tf.function(lambda x: position_wise_matmul(x, kernel), input_signature=[tf.TensorSpec(None)])
    np.testing.assert_allclose(traced(np.ones((2, 3, 8), "float32")), np.full((2, 3, 3), 8.0))


def test_apply_to_rows_equals_the_map_at_every_position_in_value_and_gradient():
    """The feed-forward network (§3.3) on the `[B*T, D]` rows equals it applied to `[B, T, D]`, and so do the
    gradients of its input and weights."""
    rng = np.random.default_rng(15)
    w1, w2 = (tf.Variable(rng.normal(size=shape).astype("float32")) for shape in [(4, 6), (6, 4)])
    x = tf.constant(rng.normal(size=(2, 3, 4)).astype("float32"))

    def ffn(v):
        return ops.matmul(ops.relu(ops.matmul(v, w1)), w2)

    def value_and_gradients(fn):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
        return [y, *tape.gradient(y, [x, w1, w2], output_gradients=tf.reshape(tf.range(24.0), (2, 3, 4)))]

    for got, want in zip(value_and_gradients(lambda v: apply_to_rows(ffn, v)), value_and_gradients(ffn)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-6)


# layer_norm: the closed-form gradient and oneDNN's fused pattern equal the plain layer norm ---------------------


def _value_and_gradient(fn, x, upstream):
    x = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = fn(x)
    return np.asarray(y), np.asarray(tape.gradient(y, x, output_gradients=tf.constant(upstream)))


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("float64", 1e-12)])
def test_closed_form_gradient_equals_autodiff_of_the_plain_standardize(dtype, tolerance):
    rng = np.random.default_rng(1)
    # An offset and a spread per row, so the mean and variance terms of the gradient both matter.
    x = (3.0 + rng.standard_normal((2, 5, 16)) * rng.uniform(0.1, 10, (2, 5, 1))).astype(dtype)
    upstream = rng.standard_normal(x.shape).astype(dtype)
    got = _value_and_gradient(lambda v: layer_norm_kernels.standardize(v, 1e-6), x, upstream)
    want = _value_and_gradient(lambda v: standardize(v, 1e-6), x, upstream)
    np.testing.assert_array_equal(got[0], want[0])  # the same forward ops
    np.testing.assert_allclose(got[1], want[1], rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype, tolerance", [("float32", 1e-4), ("bfloat16", 1e-2)])
def test_fused_layer_norm_equals_the_plain_layer_norm(dtype, tolerance):
    rng = np.random.default_rng(6)
    x = (30.0 + rng.standard_normal((4, 3, 16)) * rng.uniform(0.5, 4, (4, 3, 1))).astype("float32")
    x = np.asarray(tf.cast(tf.cast(x, dtype), tf.float32))  # what a bfloat16 input holds
    gamma, beta = (1.0 + 0.3 * rng.standard_normal(16)).astype("float32"), rng.standard_normal(16).astype("float32")
    fused = tf.function(lambda v: layer_norm_kernels.fused_layer_norm(v, 1e-6, gamma, beta))
    got = np.asarray(tf.cast(fused(tf.cast(x, dtype)), tf.float32))
    want = np.asarray(standardize(x, 1e-6)) * gamma + beta
    np.testing.assert_allclose(got, want, rtol=tolerance, atol=tolerance)


def test_fused_layer_norm_runs_only_at_inference_in_a_graph_with_onednn_and_no_tape():
    assert not layer_norm_kernels.fused_layer_norm_runs("float32", training=False)  # eager
    runs = tf.function(lambda: tf.constant(layer_norm_kernels.fused_layer_norm_runs("float32", False)))
    assert bool(runs()) == compat.onednn_kernels_enabled()
    assert not tf.function(lambda: tf.constant(layer_norm_kernels.fused_layer_norm_runs("float32", True)))()
    assert not tf.function(lambda: tf.constant(layer_norm_kernels.fused_layer_norm_runs("float16", False)))()


# dropout: given its keep mask, exact-rate dropout is the plain dropout ------------------------------------------


@pytest.mark.parametrize("rate, shape", [(0.3, (64, 32)), (0.1, (63, 31)), (0.002, (64, 32))])
def test_exact_rate_dropout_equals_the_plain_form_with_its_keep_mask(rate, shape):
    """Kept values scaled by 1 / the kept share, the others zero, forward; the same mask backward."""
    x = tf.random.stateless_normal(shape, seed=(1, 2))
    seed = tf.constant([3, 4], tf.int32)
    keep, kept_share = dropout_kernels.keep_mask(x, rate, seed)
    assert kept_share == pytest.approx(1 - rate, abs=2**-16)
    upstream = tf.random.stateless_normal(shape, seed=(5, 6))

    def plain(v):
        return ops.where(keep, v / kept_share, 0.0)

    got = _value_and_gradient(lambda v: dropout_kernels.exact_rate_dropout(v, rate, seed), np.asarray(x), upstream)
    want = _value_and_gradient(plain, np.asarray(x), upstream)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6)
    assert 0 < float(np.mean(~np.asarray(keep))) < 1


def test_exact_rate_dropout_runs_on_tensorflow_without_noise_shape_for_rates_strictly_between_0_and_1():
    assert dropout_kernels.exact_rate_dropout_runs(0.1, None) == (keras.backend.backend() == "tensorflow")
    assert not dropout_kernels.exact_rate_dropout_runs(0.1, (None, 1))
    assert not dropout_kernels.exact_rate_dropout_runs(1.0, None)
    assert not dropout_kernels.exact_rate_dropout_runs(0.0, None)
