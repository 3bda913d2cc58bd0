"""`keras_transformer.kernels.loss`: the XLA forms of the §5.4 loss equal the plain label-smoothed cross-entropy.

Value and gradient, eagerly, in a graph and inside an XLA-compiled step, in
float32 and in low precision.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import LabelSmoothedCrossEntropy
from keras_transformer.kernels import loss as loss_kernel
from keras_transformer.losses import smoothed_token_loss

compiled = loss_kernel.xla_compiled(smoothed_token_loss)


def plain_label_smoothed_sum(logits, labels, weights, epsilon):
    """`sum_t weights_t * -sum_k q_t(k) log softmax(z_t)(k)`, written out with TensorFlow's ops (§5.4)."""
    vocab = logits.shape[-1]
    q = (1.0 - epsilon) * tf.one_hot(labels, vocab) + epsilon / vocab
    return tf.reduce_sum(-tf.reduce_sum(q * tf.nn.log_softmax(logits), -1) * weights)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("upstream", [1.0, 3.0], ids=["upstream 1", "upstream 3"])
def test_weighted_loss_with_gradient_equals_the_plain_formula(epsilon, upstream):
    """The one-pass kernel against the label-smoothed cross-entropy written out, differentiated by autodiff."""
    rng = np.random.default_rng(7)
    logits = tf.constant(rng.normal(size=(2, 5, 11)).astype("float32") * 3)
    labels = tf.constant(rng.integers(0, 11, size=(2, 5)).astype("int32"))
    weights = tf.constant(rng.uniform(size=(2, 5)).astype("float32") * (rng.uniform(size=(2, 5)) > 0.3))
    results = []
    for function in (loss_kernel.weighted_loss_with_gradient, plain_label_smoothed_sum):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = function(logits, labels, weights, epsilon)
            scaled = value * upstream
        results.append((value.numpy(), tape.gradient(scaled, logits).numpy()))
    (value, gradient), (plain_value, plain_gradient) = results
    assert abs(plain_value) > 1.0  # a real sum, not an empty one
    np.testing.assert_allclose(value, plain_value, rtol=1e-6)
    np.testing.assert_allclose(gradient, plain_gradient, atol=1e-6)
    assert np.all(gradient[weights.numpy() == 0] == 0)


def test_argmax_equals_keras_argmax_and_takes_the_first_of_ties():
    rng = np.random.default_rng(8)
    logits = rng.integers(-3, 3, size=(4, 6, 9)).astype("float32")  # many ties
    logits[0, 0, :] = 0.0
    logits[0, 0, 2] = -0.0
    found = loss_kernel.argmax(tf.constant(logits))
    assert found.dtype == tf.int32
    np.testing.assert_array_equal(found.numpy(), np.argmax(logits, axis=-1))
    np.testing.assert_array_equal(found.numpy(), keras.ops.argmax(logits, axis=-1).numpy())
    for dtype in (tf.bfloat16, tf.float16):
        np.testing.assert_array_equal(loss_kernel.argmax(tf.cast(logits, dtype)).numpy(), np.argmax(logits, -1))


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_xla_compiled_loss_equals_the_generic_one(epsilon):
    """The TF path (one XLA cluster) and the keras.ops path agree, value and gradient."""
    rng = np.random.default_rng(2)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32") * 3)
    labels = tf.constant([[1, 6, 0], [2, 2, 5]])
    upstream = tf.constant(rng.normal(size=(2, 3)).astype("float32"))
    results = []
    for fn in (compiled, smoothed_token_loss):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = fn(logits, labels, epsilon)
            weighted = tf.reduce_sum(value * upstream)
        results.append((value.numpy(), tape.gradient(weighted, logits).numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)
    # bf16 logits: cast to float32 inside the compiled loss; the gradient comes back in bf16.
    half = tf.cast(logits, tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch(half)
        value = compiled(half, labels, epsilon)
        weighted = tf.reduce_sum(value * upstream)
    gradient = tape.gradient(weighted, half)
    assert value.dtype == tf.float32 and gradient.dtype == tf.bfloat16
    expected = smoothed_token_loss(tf.cast(half, tf.float32), labels, epsilon)
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.cast(gradient, tf.float32).numpy(), results[1][1], atol=2e-2)


def _loss_and_gradient(loss, labels, logits, sample_weight=None, upstream=1.0, mode="eager"):
    """The loss and the gradient of `upstream` x loss, with the tape inside the function (as in fit's step)."""

    def run(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits, sample_weight=sample_weight)
            scaled = value * upstream
        return value, tape.gradient(scaled, logits)

    if mode == "eager":
        return run(logits)
    return tf.function(run, jit_compile=mode == "xla")(logits)


MODES = ["eager", "graph", "xla"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", [1.0, 3.0], ids=["upstream 1", "upstream 3"])
@pytest.mark.parametrize("with_sample_weight", [False, True], ids=["", "sample weights"])
def test_loss_with_its_gradient_from_the_forward_pass_equals_the_per_token_formula(upstream, with_sample_weight, mode):
    """The TF path (value and gradient in one XLA pass, the gradient scaled by the upstream one, or not when
    it is 1; eagerly, in a graph and inside an XLA-compiled step) against the mean of the per-token losses
    of `call()` differentiated by autodiff."""
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(size=(2, 4, 9)).astype("float32") * 3)
    labels = tf.constant([[1, 8, 0, 0], [2, 2, 5, 3]])
    sample_weight = tf.constant([[1.0, 0.5, 1.0, 1.0], [2.0, 0.0, 1.0, 1.0]]) if with_sample_weight else None
    loss = LabelSmoothedCrossEntropy(0.1)
    value, gradient = _loss_and_gradient(loss, labels, logits, sample_weight, upstream, mode)
    weights = tf.cast(labels != 0, tf.float32) * (1.0 if sample_weight is None else sample_weight)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        reference = tf.reduce_sum(loss.call(labels, logits) * weights) / tf.reduce_sum(weights)
        scaled = reference * upstream
    np.testing.assert_allclose(value.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gradient.numpy(), tape.gradient(scaled, logits).numpy(), atol=1e-7)


def test_loss_gradient_in_low_precision():
    """bf16 logits get a bf16 gradient (float32's within bf16 rounding); float16 logits keep the gradient in
    float32 until the upstream gradient (a loss scale) has scaled it, so it does not underflow."""
    rng = np.random.default_rng(4)
    # Logits that bf16 and float16 represent exactly, so every dtype differentiates the same function.
    logits = tf.cast(tf.cast(rng.normal(size=(8, 64, 50)).astype("float32") * 8, tf.bfloat16), tf.float32)
    labels = tf.constant(rng.integers(1, 50, size=(8, 64)))
    loss = LabelSmoothedCrossEntropy(0.0)  # no epsilon / V floor under the gradients: many are tiny
    scale = 2.0**15
    _, exact = _loss_and_gradient(loss, labels, logits, upstream=scale)
    exact = exact.numpy()
    _, half = _loss_and_gradient(loss, labels, tf.cast(logits, tf.bfloat16), upstream=scale)
    assert half.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(half, tf.float32).numpy(), exact, rtol=2**-8, atol=1e-30)
    _, half = _loss_and_gradient(loss, labels, tf.cast(logits, tf.float16), upstream=scale)
    assert half.dtype == tf.float16
    half = tf.cast(half, tf.float32).numpy()
    np.testing.assert_allclose(half, exact, rtol=2**-10, atol=6e-8)
    # Unscaled, these gradients would be below float16's smallest number (6e-8) and round to 0.
    tiny = np.abs(exact / scale) < 3e-8
    assert tiny.mean() > 0.1 and np.mean(half[tiny] != 0) > 0.5
