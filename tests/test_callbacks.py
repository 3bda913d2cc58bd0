"""The training callbacks (`keras_transformer.training.callbacks`).

- The learning-rate cooldown (`cooldown_factor`, `LinearCooldown`): equation
  (3) times a factor falling to zero over the end of the run.
- The exponential moving average of the weights (`ema`: `ValidateWithEMA`,
  `KeepTrainingWeights`): the final model is the average, and training itself
  is not changed by keeping one (also across several `fit()` calls).
"""

import json
import shutil

import keras
import numpy as np
import pytest
from conftest import TINY_NET, new_run_dir, read_csv

from keras_transformer import compat, training
from keras_transformer.optimization import Cooldown, TransformerSchedule, create_optimizer
from keras_transformer.run_dir import load_run
from keras_transformer.training.callbacks import cooldown_factor


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
    test_loop.py): 10 steps in a 10 s budget, the last half of it cooling down.
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


# ----------------------------------------------------------------------------------
# The exponential moving average of the weights (ema)
# ----------------------------------------------------------------------------------


def run_args(path, spm500, **options):
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(spm500, path / "spm.model")
    values = dict(
        output=str(path),
        preset="tiny",
        vocab_size=500,
        overrides=TINY_NET,
        batch_tokens=1024,
        max_length=32,
        warmup_steps=2,
        max_steps=5,
        checkpoint_every=1,
        keep_checkpoints=10,
        validation_split=None,
        verbose=0,
        seed=3,
    )
    values.update(options)
    return training.TrainingArgs(**values)


def checkpoint_weights(run_dir, step):
    model, _ = load_run(str(run_dir), checkpoint=str(run_dir / "checkpoints" / f"ckpt-{step:08d}.weights.h5"))
    return model.get_weights()


def test_final_model_is_the_moving_average_of_the_training_weights(tmp_path, spm500):
    decay, steps = 0.6, 5
    result = training.train(run_args(tmp_path / "ema", spm500, ema=decay, max_steps=steps))
    # Keras' EMA: the average starts at the weights after the first update, then
    # average <- decay * average + (1 - decay) * weights after every update.
    average = None
    for step in range(1, steps + 1):
        weights = checkpoint_weights(tmp_path / "ema", step)
        average = weights if average is None else [decay * a + (1 - decay) * w for a, w in zip(average, weights)]
    for got, expected in zip(result.model.get_weights(), average):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # ... and is not simply the last weights.
    assert any(
        not np.allclose(a, b) for a, b in zip(result.model.get_weights(), checkpoint_weights(tmp_path / "ema", 5))
    )


def test_keeping_an_average_does_not_change_training_across_fit_calls(tmp_path, spm500):
    """A run of several fit() calls (steps_per_execution > 1: one per epoch) trains the same weights
    with and without --ema: each fit() ends by writing the average into the model, and it is undone."""
    from keras_transformer.data.corpora import read_lines

    for lang in ("en", "de"):  # 80 pairs: epochs of a few steps
        (tmp_path / f"small.{lang}").write_text("\n".join(read_lines("val", lang)[:80]) + "\n", encoding="utf-8")
    options = dict(
        max_steps=None,
        epochs=3,
        steps_per_execution=2,
        checkpoint_every=1,
        keep_checkpoints=100,
        data=f"files:{tmp_path}/small.en,{tmp_path}/small.de",
        batch_tokens=512,
        validation_split="train",
    )  # validation (with the average) at every epoch end, too
    plain = training.train(run_args(tmp_path / "plain", spm500, **options))
    averaged = training.train(run_args(tmp_path / "ema", spm500, ema=0.9, **options))
    assert plain.step == averaged.step and len(plain.history) == 3  # three epochs: three fit() calls
    # Checkpoints where an execution ends: every 2 steps and at each epoch's end.
    steps = [step for step, _ in training.list_checkpoints(str(tmp_path / "plain"))]
    assert steps == [step for step, _ in training.list_checkpoints(str(tmp_path / "ema"))]
    assert len(steps) >= 3 and steps[-1] == plain.step
    for step in steps:
        for a, b in zip(checkpoint_weights(tmp_path / "plain", step), checkpoint_weights(tmp_path / "ema", step)):
            np.testing.assert_array_equal(a, b)


def test_swap_ema_weights_swaps_and_swaps_back(tmp_path, spm500):
    result = training.train(run_args(tmp_path / "run", spm500, ema=0.5, max_steps=3))
    model = result.model  # compiled afresh: build an EMA optimizer on it
    import keras

    model.compile(optimizer=keras.optimizers.Adam(use_ema=True, ema_momentum=0.5))
    model.optimizer.build(model.trainable_variables)
    before = [v.numpy() for v in model.trainable_variables]
    for average, value in zip(model.optimizer._model_variables_moving_average, before):
        average.assign(value + 1.0)
    compat.swap_ema_weights(model)
    for variable, value in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(variable.numpy(), (value + 1.0).astype(value.dtype))
    compat.swap_ema_weights(model)
    for variable, value in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(variable.numpy(), value)  # back, bit for bit


def test_ema_options_are_checked():
    with pytest.raises(ValueError, match="ema must be a decay"):
        training.TrainingArgs(ema=1.5)
    with pytest.raises(ValueError, match="use one of them"):
        training.TrainingArgs(ema=0.99, average_last=5)


def test_a_resume_that_would_not_load_the_optimizer_state_is_refused(tmp_path, spm500):
    """Keras skips loading an optimizer whose variables differ (with and without --ema) with a
    warning only: Adam's moments and the schedule's step would start over under "resumed from
    step N". --ema is an option a resume cannot change, and an optimizer left unloaded is an error
    (here a run recorded before --ema could be compared, so only the second check catches it)."""
    run_dir = tmp_path / "run"
    training.train(run_args(run_dir, spm500, max_steps=2))
    state = json.loads((run_dir / "backup" / "state.json").read_text())
    assert (state["step"], state["iterations"]) == (2, 2)
    with pytest.raises(ValueError, match=r"ema \(None -> 0.9\)"):
        training.train(run_args(run_dir, spm500, max_steps=4, ema=0.9))
    config = json.loads((run_dir / "config.json").read_text())
    del config["training"]["ema"]
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ValueError,
        match=r"optimizer state in .*state-00000002.weights.h5 was not loaded: the "
        r"optimizer is at 0 updates, not 2.*another ema",
    ):
        training.train(run_args(run_dir, spm500, max_steps=4, ema=0.9))
    assert training.train(run_args(run_dir, spm500, max_steps=4)).resumed_from == 2  # without --ema: it goes on
