"""--ema: the final model is the exponential moving average of the training weights, and training
itself is not changed by keeping one (also across several fit() calls)."""

import json
import shutil

import numpy as np
import pytest

from keras_transformer import compat, training
from keras_transformer.run_dir import load_run

TINY_NET = {"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64}


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
