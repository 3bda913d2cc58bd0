"""`keras_transformer.losses`: the §5.4 label-smoothed cross-entropy and the token accuracy, against their formulas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.kernels import loss as loss_kernel


def numpy_smoothed_loss(logits, labels, epsilon, pad=0):
    vocab = logits.shape[-1]
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = np.full(logits.shape, epsilon / vocab)
    np.put_along_axis(q, labels[..., None], 1 - epsilon + epsilon / vocab, axis=-1)
    per_token = -(q * log_p).sum(-1)
    mask = labels != pad
    return (per_token * mask).sum() / mask.sum()


def test_label_smoothed_loss_equals_formula_and_ignores_padding():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[3, 1, 0, 0], [5, 6, 2, 0]])
    loss = LabelSmoothedCrossEntropy(0.1)
    assert float(loss(labels, logits)) == pytest.approx(numpy_smoothed_loss(logits, labels, 0.1), rel=1e-5)
    # Whatever sits at padded positions does not matter.
    changed = logits.copy()
    changed[labels == 0] = 100.0
    assert float(loss(labels, changed)) == pytest.approx(float(loss(labels, logits)), rel=1e-6)
    # epsilon = 0 is the ordinary cross-entropy.
    plain = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).numpy()
    assert float(LabelSmoothedCrossEntropy(0.0)(labels, logits)) == pytest.approx(plain[labels != 0].mean(), rel=1e-5)


def test_label_smoothed_gradient_is_softmax_minus_target():
    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(1, 3, 5)).astype("float32"))
    labels = np.array([[1, 4, 0]])
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = LabelSmoothedCrossEntropy(0.2)(labels, logits)
    grad = tape.gradient(value, logits).numpy()
    with tf.GradientTape() as tape:
        tape.watch(logits)
        log_p = tf.nn.log_softmax(logits)
        q = 0.8 * tf.one_hot(labels, 5) + 0.2 / 5
        reference = tf.reduce_sum(-tf.reduce_sum(q * log_p, -1) * (labels != 0)) / 2.0
    np.testing.assert_allclose(grad, tape.gradient(reference, logits).numpy(), atol=1e-6)
    assert np.all(grad[0, 2] == 0)


def test_fit_computes_the_loss_gradient_ahead_and_evaluate_does_not(monkeypatch):
    calls = []
    one_pass = loss_kernel.weighted_loss_with_gradient
    monkeypatch.setattr(loss_kernel, "weighted_loss_with_gradient", lambda *args: calls.append(1) or one_pass(*args))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(7, 7)])  # ids -> logits
    model.compile(optimizer="sgd", loss=LabelSmoothedCrossEntropy(0.1))
    ids = np.array([[1, 6, 0], [2, 2, 5]])
    labels = np.array([[3, 1, 0], [5, 6, 2]])
    model.evaluate(ids, labels, verbose=0)
    assert calls == []
    before = model.get_weights()[0].copy()
    model.fit(ids, labels, epochs=1, verbose=0)
    assert calls == [1]  # traced once, under fit's tape
    assert not np.allclose(model.get_weights()[0], before)


def test_loss_computes_its_gradient_ahead_only_under_a_tape(monkeypatch):
    """A function traced under a tape takes the one-pass value-and-gradient path; one traced without does
    not, and gets the same value."""
    calls = []
    one_pass = loss_kernel.weighted_loss_with_gradient
    monkeypatch.setattr(loss_kernel, "weighted_loss_with_gradient", lambda *args: calls.append(1) or one_pass(*args))
    rng = np.random.default_rng(6)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32"))
    labels = tf.constant([[1, 6, 0], [2, 2, 5]])
    loss = LabelSmoothedCrossEntropy(0.1)
    evaluated = float(tf.function(loss)(labels, logits))
    assert calls == []
    with tf.GradientTape() as tape:
        tape.watch(logits)
        trained = float(tf.function(loss)(labels, logits))
    assert calls == [1]
    assert evaluated == pytest.approx(trained, rel=1e-6)
    assert evaluated == pytest.approx(numpy_smoothed_loss(logits.numpy(), labels.numpy(), 0.1), rel=1e-5)


def test_loss_and_its_gradient_ignore_non_finite_logits_at_padding():
    logits = np.random.default_rng(5).normal(size=(1, 3, 6)).astype("float32")
    logits[0, 2] = np.inf
    expected = numpy_smoothed_loss(logits[:, :2], np.array([[1, 4]]), 0.1)
    loss = LabelSmoothedCrossEntropy(0.1)
    logits = tf.constant(logits)
    labels = np.array([[1, 4, 0]])
    with tf.GradientTape() as tape:  # the one-pass path with its gradient
        tape.watch(logits)
        with_gradient = loss(labels, logits)
    gradient = tape.gradient(with_gradient, logits).numpy()
    assert float(with_gradient) == pytest.approx(expected, rel=1e-5)
    assert np.all(gradient[0, 2] == 0) and np.all(np.isfinite(gradient))
    # The value-only path, differentiated by autodiff (a function traced without a tape).
    value_only = tf.function(lambda logits: loss(labels, logits)).get_concrete_function(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = value_only(logits)
    assert float(value) == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(tape.gradient(value, logits).numpy(), gradient, atol=1e-7)


def test_masked_accuracy_counts_only_real_tokens():
    metric = MaskedAccuracy()
    logits = np.zeros((1, 4, 5), "float32")
    logits[0, 0, 2] = logits[0, 1, 3] = logits[0, 2, 1] = logits[0, 3, 4] = 1.0
    metric.update_state(np.array([[2, 3, 4, 0]]), logits)  # right, right, wrong, pad
    assert float(metric.result()) == pytest.approx(2 / 3)


@pytest.mark.parametrize("batch", [2, 3])  # 3: as many sentences as tokens, where [B] would broadcast over T
def test_masked_accuracy_takes_a_weight_per_sentence_as_the_loss_does(batch):
    logits = np.zeros((batch, 3, 5), "float32")
    labels = np.ones((batch, 3), "int32")
    logits[0, :, 1] = 1.0  # sentence 0 all right, the others all wrong
    per_sentence = np.zeros(batch, "float32")
    per_sentence[0] = 1.0
    metric = MaskedAccuracy()
    metric.update_state(labels, logits, sample_weight=per_sentence)
    assert float(metric.result()) == pytest.approx(1.0)
    per_token = MaskedAccuracy()
    per_token.update_state(labels, logits, sample_weight=np.repeat(per_sentence[:, None], 3, axis=1))
    assert float(per_token.result()) == pytest.approx(1.0)


def test_loss_refuses_a_reduction_it_would_ignore():
    with pytest.raises(ValueError, match="reduction='none' is not supported"):
        LabelSmoothedCrossEntropy(0.1, reduction="none")
    LabelSmoothedCrossEntropy(0.1, reduction="sum_over_batch_size")  # Keras' default: what it does
