"""`keras_transformer.kernels.adam`: the fused Adam update leaves the weights Keras' Adam leaves (§5.3)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.kernels import adam as adam_kernel
from keras_transformer.optimization import FusedAdam, TransformerSchedule

PAPER = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def problem(seed=3, steps=6):
    rng = np.random.default_rng(seed)
    init = [rng.normal(size=(5, 4)).astype("float32"), rng.normal(size=(4,)).astype("float32")]
    gradients = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(steps)]
    return init, gradients


def update_fn(optimizer, variables, fused):
    """One step of Keras' Adam, or the same step by `fused_update` on the optimizer's own moments."""

    def step(grads):
        if not fused:
            optimizer.apply(grads, variables)
            return
        learning_rate = optimizer.learning_rate  # the schedule at the current iterations
        for gradient, variable in zip(grads, variables):
            adam_kernel.fused_update(optimizer, gradient, variable, learning_rate)
        optimizer.iterations.assign_add(1)

    return step


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_fused_update_leaves_the_weights_of_keras_adam(mode):
    """Several steps of `fused_update` on a plain `keras.optimizers.Adam`'s own moments against its `apply`."""
    init, gradients = problem()
    results = []
    for fused in (False, True):
        variables = [keras.Variable(w) for w in init]
        optimizer = keras.optimizers.Adam(learning_rate=TransformerSchedule(8, warmup_steps=2), **PAPER)
        optimizer.build(variables)
        step = update_fn(optimizer, variables, fused)
        step = tf.function(step) if mode == "graph" else step
        for grads in gradients:
            step([tf.constant(g) for g in grads])
        assert int(optimizer.iterations) == len(gradients)
        results.append([v.numpy() for v in variables + optimizer.variables[1:]])  # weights, then m and v
    for keras_value, fused_value in zip(*results):
        # Float32 rounding in a different order: a few units in the last place of weights of order 1.
        np.testing.assert_allclose(fused_value, keras_value, rtol=1e-6, atol=1e-6)
    for keras_value, start in zip(results[0], init):
        assert np.abs(keras_value - start).max() > 1e-3  # the updates did something


def test_fused_update_applies_to_dense_tensorflow_gradients_only():
    optimizer = keras.optimizers.Adam()
    dense = tf.ones([3, 2])
    sparse = tf.IndexedSlices(tf.ones([1, 2]), tf.constant([1]), tf.constant([3, 2]))
    assert adam_kernel.fused_update_applies(optimizer, dense)
    assert not adam_kernel.fused_update_applies(optimizer, sparse)
    assert not adam_kernel.fused_update_applies(keras.optimizers.Adam(amsgrad=True), dense)


def test_fused_adam_takes_the_fused_update_for_dense_gradients(monkeypatch):
    calls = []
    fused_update = adam_kernel.fused_update
    monkeypatch.setattr(adam_kernel, "fused_update", lambda *args: calls.append(1) or fused_update(*args))
    init, gradients = problem(steps=2)
    variables = [keras.Variable(w) for w in init]
    optimizer = FusedAdam(learning_rate=1e-2, **PAPER)
    for grads in gradients:
        optimizer.apply([tf.constant(g) for g in grads], variables)
    assert calls == [1] * (2 * len(gradients))  # each variable, each step
