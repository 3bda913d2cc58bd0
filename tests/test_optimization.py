"""`keras_transformer.optimization`: the schedule of equation (3) and Adam's hyperparameters (§5.3)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import TransformerSchedule, create_optimizer


def paper_rate(step_num, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup**-1.5)


@pytest.mark.parametrize("step_num", [1, 4000, 100000])
def test_schedule_equals_equation_3(step_num):
    schedule = TransformerSchedule(512, warmup_steps=4000)
    assert float(schedule.rate(step_num)) == pytest.approx(paper_rate(step_num), rel=1e-6)
    # Keras passes the number of updates already applied: update k uses step_num k + 1.
    assert float(schedule(step_num - 1)) == pytest.approx(paper_rate(step_num), rel=1e-6)


def test_schedule_serializes_and_optimizer_uses_paper_adam():
    schedule = TransformerSchedule(256, warmup_steps=100, scale=2.0)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert float(clone(10)) == pytest.approx(float(schedule(10)))
    optimizer = create_optimizer(512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def test_fused_adam_matches_keras_adam_dense_and_sparse():
    """FusedAdam's one-kernel update is Keras' Adam; sparse gradients take Keras' path."""
    from keras_transformer.optimization import FusedAdam

    rng = np.random.default_rng(5)
    init = [rng.normal(size=(6, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    steps = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(5)]
    results = []
    for optimizer_class in (keras.optimizers.Adam, FusedAdam):
        variables = [keras.Variable(w) for w in init]
        optimizer = optimizer_class(
            learning_rate=TransformerSchedule(8, warmup_steps=2), beta_1=0.9, beta_2=0.98, epsilon=1e-9
        )

        apply = _graph_update(optimizer, variables)
        for grads in steps:
            apply(tf.constant(grads[1]), tf.constant(grads[0][:2]))
        results.append([v.numpy() for v in variables])
        assert int(optimizer.iterations) == len(steps)
    for keras_value, fused_value, start in zip(*results, init):
        assert np.abs(keras_value - start).max() > 1e-3  # the updates did something
        np.testing.assert_allclose(fused_value, keras_value, rtol=1e-6, atol=1e-7)


def _graph_update(optimizer, variables):
    """A tf.function applying a sparse gradient (rows 0 and 4) to variables[0] and a dense one to variables[1]."""

    @tf.function
    def apply(dense, rows):
        sparse = tf.IndexedSlices(rows, tf.constant([0, 4]), tf.constant([6, 3]))
        optimizer.apply([sparse, dense], variables)

    return apply


def test_fused_adam_serializes_as_itself():
    optimizer = create_optimizer(64, warmup_steps=10, clipnorm=1.0)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone).__name__ == "FusedAdam"
    assert (clone.beta_2, clone.epsilon, clone.clipnorm) == (0.98, 1e-9, 1.0)
