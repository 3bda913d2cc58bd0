"""The learning-rate cooldown: equation (3) times a factor falling to zero over the end of the run."""

import json

import keras
import numpy as np
import pytest
from conftest import new_run_dir, read_csv

from keras_transformer import training
from keras_transformer.optimization import Cooldown, TransformerSchedule, create_optimizer
from keras_transformer.training.callbacks import cooldown_factor

TINY_NET = {"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64}


def test_factor_is_one_then_falls_linearly_to_zero_at_the_end():
    # 8 steps, the last half cooling down: the update after k steps gets (1 - k/8) / 0.5.
    assert [cooldown_factor(k, 8, 0.5) for k in range(9)] == [1, 1, 1, 1, 1, 0.75, 0.5, 0.25, 0]
    assert cooldown_factor(3, 8, 1.0) == pytest.approx(5 / 8)
    # A time budget further along than the steps decides: 45 of 60 s is 75% of the run.
    assert cooldown_factor(2, 100, 0.5, seconds=45.0, budget_seconds=60.0) == pytest.approx(0.5)
    assert cooldown_factor(90, 100, 0.5, seconds=1.0, budget_seconds=60.0) == pytest.approx(0.2)
    assert cooldown_factor(2, 100, 0.5, seconds=80.0, budget_seconds=60.0) == 0.0


def test_cooldown_scales_the_schedule_and_round_trips():
    base = TransformerSchedule(256, warmup_steps=40, scale=0.8)
    schedule = Cooldown(base)
    steps = np.array([0, 10, 39, 200])
    np.testing.assert_allclose([float(schedule(s)) for s in steps], [float(base(s)) for s in steps], rtol=1e-7)
    schedule.factor.assign(0.3)
    np.testing.assert_allclose([float(schedule(s)) for s in steps], [0.3 * float(base(s)) for s in steps], rtol=1e-6)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, Cooldown) and restored.schedule.get_config() == base.get_config()
    assert float(restored(200)) == pytest.approx(float(schedule(200)))
    # The library's default is the paper's schedule alone.
    assert isinstance(create_optimizer(256)._learning_rate, TransformerSchedule)
    with pytest.raises(ValueError, match="cooldown"):
        training.TrainingArgs(cooldown=1.5)


def test_time_budgeted_run_cools_down_to_its_last_step(tmp_path, spm500, monkeypatch):
    """Each step's logged learning rate is equation (3) times the factor of the run's progress.

    The budget's clock advances one second per step (as in the time budget's test in
    test_training.py): 10 steps in a 10 s budget, the last half of it cooling down.
    """
    from keras_transformer.training.run import Run

    clock = {"now": 1000.0}
    monkeypatch.setattr(Run, "clock", staticmethod(lambda: clock["now"]))

    class Paced(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock["now"] += 1.0

    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        lr_scale=2.0,
        checkpoint_every=1000,
        log_every=1,
        verbose=0,
        overrides=TINY_NET,
        max_steps=100_000,
        time_budget=10.0 / 60,
        cooldown=0.5,
    )
    run_dir = new_run_dir(tmp_path / "run", spm500)
    result = training.train(training.TrainingArgs(output=str(run_dir), **options), callbacks=[Paced()])
    assert result.step == 10
    rates = [float(row["learning_rate"]) for row in read_csv(run_dir / "steps.csv")]
    paper = TransformerSchedule(TINY_NET["d_model"], warmup_steps=4, scale=2.0)
    # The update after k steps: 1 s per step before it, so 10% of the budget per step.
    factors = [1, 1, 1, 1, 1, 1, 0.8, 0.6, 0.4, 0.2]
    np.testing.assert_allclose(rates, [f * float(paper.rate(k + 1)) for k, f in enumerate(factors)], rtol=1e-5)
    # The cooldown is recorded with the run's options, and a resume may not change it.
    config = json.loads((run_dir / "config.json").read_text())
    assert config["training"]["cooldown"] == 0.5
    with pytest.raises(ValueError, match="cooldown"):
        training.train(training.TrainingArgs(output=str(run_dir), **dict(options, cooldown=0.2)))


def test_the_compiled_train_step_reads_the_factor_set_between_steps():
    """The updates `fit` applies follow the factor: at 0 a step leaves the weights as they were, at 1 it
    moves them, and the same compiled train function serves both (LinearCooldown sets the factor between
    steps of one `fit`). A schedule that read the factor only when called eagerly would log the cooled
    rate (the learning_rate column of steps.csv) and still apply the full one."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    optimizer = create_optimizer(32, warmup_steps=4, cooldown=True)
    model.compile(optimizer=optimizer, loss="mse")
    schedule = optimizer._learning_rate
    assert isinstance(schedule, Cooldown)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.random.default_rng(1).normal(size=(8, 3)).astype("float32")

    def one_step():
        before = [w.copy() for w in model.get_weights()]
        model.fit(x, y, batch_size=8, epochs=1, verbose=0, shuffle=False)
        return max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), before))

    assert one_step() > 0  # factor 1: the compiled function is traced here
    train_function = model.train_function
    schedule.factor.assign(0.0)
    assert one_step() == 0.0
    schedule.factor.assign(1.0)
    assert one_step() > 0
    schedule.factor.assign(0.0)
    assert one_step() == 0.0
    assert model.train_function is train_function  # no retracing: the factor is a variable the graph reads
