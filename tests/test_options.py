"""Training options, each checked by what it does to a tiny run.

`--lr-scale` (the rate the optimizer applies), `--xla`, `--precision
mixed_float16`, the stop on a NaN loss (also the command's exit code),
`--keep-checkpoints`, `--steps-per-execution`, and the output-length cap of a
model with learned positions. The runs are tiny (1 layer, d_model 32, a
prebuilt 500-piece vocabulary) and a few steps long.
"""

import argparse
import glob
import json
import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import new_run_dir, read_csv

from keras_transformer import run_dir as run_layout
from keras_transformer import training
from keras_transformer.cli import train as train_cli
from keras_transformer.data import DataSpec
from keras_transformer.data.tokenizer import Tokenizer
from keras_transformer.training import callbacks as run_callbacks
from keras_transformer.training.stream import TrainingData

TINY_NET = {"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64}
WARMUP = 4
# Steps 1-3 are all in the warmup: the rate grows linearly (equation 3).
BASE = dict(
    preset="tiny",
    vocab_size=500,
    batch_tokens=1024,
    max_length=32,
    validation_split=None,
    warmup_steps=WARMUP,
    checkpoint_every=1000,
    log_every=1,
    verbose=0,
    overrides=TINY_NET,
    max_steps=3,
)


def equation_3(step, scale=1.0, d_model=TINY_NET["d_model"], warmup=WARMUP):
    """lrate = scale * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (§5.3), step counted from 1."""
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def checkpoint_steps(run_dir):
    return [step for step, _ in training.list_checkpoints(str(run_dir))]


class Inspect(keras.callbacks.Callback):
    """What the training model looks like: its optimizer, XLA flag and dtype policy, and the
    weights before and after the first step."""

    def __init__(self):
        super().__init__()
        self.seen = {}

    def on_train_begin(self, logs=None):
        if "optimizer" in self.seen:  # a later `fit` call of the same run
            return
        self.seen.update(
            optimizer=self.model.optimizer,
            jit_compile=self.model.jit_compile,
            policy=self.model.dtype_policy.name,
            before=[v.numpy().copy() for v in self.model.trainable_variables],
        )

    def on_train_batch_end(self, batch, logs=None):
        self.seen.setdefault("after_first_call", [v.numpy().copy() for v in self.model.trainable_variables])

    def on_train_end(self, logs=None):
        optimizer = self.model.optimizer
        self.seen.update(
            iterations=int(optimizer.iterations.numpy()), learning_rate=float(np.asarray(optimizer.learning_rate))
        )


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory, spm500):
    """`tiny_runs(name, **options)`: a 3-step run of BASE with the changed options, trained once per name."""
    done = {}
    root = tmp_path_factory.mktemp("runs")

    def get(name, args=None, **options):
        if name not in done:
            run_dir = new_run_dir(root / name, spm500)
            if args is None:
                args = training.TrainingArgs(output=str(run_dir), **{**BASE, **options})
            else:
                args.output = str(run_dir)
            inspect = Inspect()
            result = training.train(args, callbacks=[inspect])
            done[name] = dict(result=result, seen=inspect.seen, run_dir=run_dir, steps=read_csv(run_dir / "steps.csv"))
        return done[name]

    return get


def step_losses(run):
    return [float(row["loss"]) for row in run["steps"]]


# ----------------------------------------------------------------------------------
# --lr-scale: the rate the optimizer applies is scale x equation (3)
# ----------------------------------------------------------------------------------


def lr_scale_args(scale):
    """The run's options through the command line (`--lr-scale`)."""
    parser = train_cli.add_training_arguments(argparse.ArgumentParser())
    args = train_cli.args_from_namespace(
        parser.parse_args(
            [
                "--preset",
                "tiny",
                "--vocab-size",
                "500",
                "--batch-tokens",
                "1024",
                "--max-length",
                "32",
                "--validation-split",
                "none",
                "--warmup-steps",
                str(WARMUP),
                "--checkpoint-every",
                "1000",
                "--log-every",
                "1",
                "--verbose",
                "0",
                "--max-steps",
                "3",
                "--num-layers",
                "1",
                "--d-model",
                "32",
                "--d-ff",
                "64",
                "--dropout",
                "0",
                "--lr-scale",
                str(scale),
            ]
        )
    )
    assert args.lr_scale == scale and args.model_config().d_model == TINY_NET["d_model"]
    return args


@pytest.mark.parametrize(
    "options, parameter",
    [
        (dict(precision="float64"), "precision"),
        (dict(time_budget=0), "time_budget"),
        (dict(batch_tokens=0), "batch_tokens"),
        (dict(batch_multiple=0), "batch_multiple"),
        (dict(ema=1.5), "ema"),
        (dict(ema=0.999, average_last=5), "ema"),
        (dict(resume_optimizer=True), "resume_optimizer"),
        (dict(early_stopping_patience=2), "early_stopping_patience"),
        (dict(validate_bleu_every=10, validation_split=None), "validate_bleu_every"),
        (dict(keep_checkpoints=0), "keep_checkpoints"),
        (dict(average_last=-1), "average_last"),
        (dict(average_fraction=0.5), "average_fraction"),
        (dict(cooldown=2.0), "cooldown"),
        (dict(lr_scale=0.0), "lr_scale"),
        (dict(checkpoint_minutes=0), "checkpoint_minutes"),
        (dict(checkpoint_minutes="10"), "checkpoint_minutes"),
    ],
)
def test_training_args_errors_name_the_field_not_a_flag(options, parameter):
    """A bad option raises `ParameterError` naming the `TrainingArgs` field; the command line maps it to a flag."""
    from keras_transformer.errors import ParameterError

    with pytest.raises(ParameterError) as raised:
        training.TrainingArgs(**options)
    assert raised.value.parameter == parameter
    assert str(raised.value).startswith(parameter + " ")
    assert "--" not in str(raised.value)


@pytest.mark.parametrize("scale", [1.0, 2.5])
def test_lr_scale_multiplies_equation_3(tiny_runs, scale):
    """steps.csv logs the rate of the update just applied (step s: equation 3 at s), the optimizer's
    `learning_rate` after 3 updates is the rate of the 4th, and the first update really moved the
    weights by that rate (Adam's first step is lr * g / |g|)."""
    run = tiny_runs(f"lr_scale_{scale}", args=lr_scale_args(scale))
    assert [int(row["step"]) for row in run["steps"]] == [1, 2, 3]
    for row in run["steps"]:
        step = int(row["step"])
        assert float(row["learning_rate"]) == pytest.approx(equation_3(step, scale), rel=1e-6), step
    seen = run["seen"]
    assert seen["iterations"] == 3
    assert seen["learning_rate"] == pytest.approx(equation_3(4, scale), rel=1e-6)
    moved = np.concatenate([np.abs(a - b).ravel() for a, b in zip(seen["after_first_call"], seen["before"])])
    moved = moved[moved > 0]
    assert moved.size > 0.9 * sum(w.size for w in seen["before"])
    assert np.median(moved) == pytest.approx(equation_3(1, scale), rel=1e-3)
    assert moved.max() <= equation_3(1, scale) * (1 + 1e-3)


# ----------------------------------------------------------------------------------
# --xla and --precision mixed_float16
# ----------------------------------------------------------------------------------


def test_xla_training_matches_the_plain_run(tiny_runs):
    """The train step is compiled with XLA (`jit_compile`) and its losses are those of the plain run
    with the same seed: the first (no update yet) to rounding, the next ones to 1e-4 (XLA fuses
    differently: last-bit differences, which Adam's sign-like first updates can amplify)."""
    plain = tiny_runs("lr_scale_1.0", args=lr_scale_args(1.0))
    xla = tiny_runs("xla", xla=True)
    assert plain["seen"]["jit_compile"] is False and xla["seen"]["jit_compile"] is True
    assert xla["result"].step == 3 and [int(row["step"]) for row in xla["steps"]] == [1, 2, 3]
    losses, reference = step_losses(xla), step_losses(plain)
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[0] == pytest.approx(reference[0], rel=1e-5)
    np.testing.assert_allclose(losses, reference, rtol=1e-4)
    assert not xla["result"].stopped_on_nan and os.path.isfile(xla["run_dir"] / "model.keras")


def test_mixed_float16_wraps_the_optimizer_in_loss_scaling(tiny_runs):
    plain = tiny_runs("lr_scale_1.0", args=lr_scale_args(1.0))
    mixed = tiny_runs("mixed_float16", precision="mixed_float16")
    seen = mixed["seen"]
    assert seen["policy"] == "mixed_float16" and plain["seen"]["policy"] == "float32"
    assert isinstance(seen["optimizer"], keras.optimizers.LossScaleOptimizer)
    assert not isinstance(plain["seen"]["optimizer"], keras.optimizers.LossScaleOptimizer)
    from keras_transformer.optimization import FusedAdam

    assert isinstance(seen["optimizer"].inner_optimizer, FusedAdam)
    assert mixed["result"].step == 3
    losses = step_losses(mixed)
    assert all(math.isfinite(loss) for loss in losses)
    # The first step's loss (the initial weights, computed in float16) is the float32 one to float16 precision.
    assert losses[0] == pytest.approx(step_losses(plain)[0], rel=1e-3)
    # The monitor reads the rate through the loss-scale wrapper.
    applied = seen["iterations"]
    assert 1 <= applied <= 3
    assert float(mixed["steps"][-1]["learning_rate"]) == pytest.approx(equation_3(applied), rel=1e-6)
    # The final model is float32 whatever the training precision.
    assert all(w.dtype == np.float32 and np.isfinite(w).all() for w in mixed["result"].model.get_weights())
    assert keras.mixed_precision.global_policy().name == "float32"


# ----------------------------------------------------------------------------------
# NaN: training stops, nothing after the NaN is kept, the command fails
# ----------------------------------------------------------------------------------


class NaNWeightsAfterStep(keras.callbacks.Callback):
    """Fills one weight with NaN after step `step` (after the run's own checkpoint of that step):
    the loss of the next step is NaN."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.step:
            variable = self.model.trainable_variables[0]
            variable.assign(np.full(variable.shape, np.nan, variable.dtype))


def test_nan_loss_stops_training_without_a_model(tmp_path, spm500, capsys):
    run_dir = new_run_dir(tmp_path / "run", spm500)
    args = training.TrainingArgs(
        output=str(run_dir), **{**BASE, "max_steps": 6, "checkpoint_every": 1, "keep_checkpoints": 10}
    )
    result = training.train(args, callbacks=[NaNWeightsAfterStep(2)])
    out = capsys.readouterr().out
    assert result.stopped_on_nan and result.step == 3  # stopped at the first NaN step, not at 6
    assert "Training stopped at step 3: the loss is NaN" in out and "no model.keras" in out
    assert not os.path.exists(run_dir / "model.keras")
    assert checkpoint_steps(run_dir) == [1, 2]  # none of the NaN step
    assert json.loads((run_dir / "backup" / "state.json").read_text())["step"] == 2
    rows = read_csv(run_dir / "steps.csv")
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    assert math.isfinite(float(rows[1]["loss"])) and math.isnan(float(rows[2]["loss"]))
    assert result.val_metrics is None


def test_nan_from_a_huge_lr_scale_makes_the_command_fail(tmp_path, spm500, capsys):
    """`--lr-scale 1e6` blows the weights up within a few steps; `keras-transformer train` returns 1."""
    run_dir = new_run_dir(tmp_path / "run", spm500)
    parser = train_cli.add_training_arguments(argparse.ArgumentParser())
    namespace = parser.parse_args(
        [
            "--preset",
            "tiny",
            "--vocab-size",
            "500",
            "--batch-tokens",
            "1024",
            "--max-length",
            "32",
            "--validation-split",
            "none",
            "--warmup-steps",
            str(WARMUP),
            "--checkpoint-every",
            "1",
            "--keep-checkpoints",
            "20",
            "--log-every",
            "1",
            "--verbose",
            "0",
            "--max-steps",
            "20",
            "--num-layers",
            "1",
            "--d-model",
            "32",
            "--d-ff",
            "64",
            "--dropout",
            "0",
            "--lr-scale",
            "1e6",
            "--average-last",
            "3",
            "--output",
            str(run_dir),
        ]
    )
    assert train_cli.run(namespace) == 1
    out = capsys.readouterr().out
    rows = read_csv(run_dir / "steps.csv")
    nan_step = int(rows[-1]["step"])
    assert math.isnan(float(rows[-1]["loss"])) and nan_step < 20
    assert all(math.isfinite(float(r["loss"])) for r in rows[:-1])
    assert f"Training stopped at step {nan_step}: the loss is NaN" in out
    assert not os.path.exists(run_dir / "model.keras") and "Averaged" not in out
    assert checkpoint_steps(run_dir) == list(range(1, nan_step))


# ----------------------------------------------------------------------------------
# --keep-checkpoints
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("average_last, kept", [(0, [5, 6]), (3, [4, 5, 6])])
def test_keep_checkpoints_keeps_the_newest_and_at_least_average_last(tmp_path, spm500, capsys, average_last, kept):
    run_dir = new_run_dir(tmp_path / "run", spm500)
    args = training.TrainingArgs(
        output=str(run_dir),
        **{**BASE, "max_steps": 6, "checkpoint_every": 1, "keep_checkpoints": 2, "average_last": average_last},
    )
    result = training.train(args)
    assert result.step == 6
    assert checkpoint_steps(run_dir) == kept
    assert sorted(os.listdir(run_dir / "checkpoints")) == [f"ckpt-{s:08d}.weights.h5" for s in kept]
    out = capsys.readouterr().out
    if average_last:
        assert "Averaged the last 3 checkpoints: " + ", ".join(f"ckpt-{s:08d}.weights.h5" for s in kept) in out
    else:
        assert "Averaged" not in out


# ----------------------------------------------------------------------------------
# --steps-per-execution
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """80 Multi30k pairs: epochs of a few steps (an odd number with batch_tokens 256)."""
    from keras_transformer.data import corpora

    path = tmp_path_factory.mktemp("corpus")
    for lang in ("en", "de"):
        (path / f"train.{lang}").write_text("\n".join(corpora.read_lines("train", lang)[:80]) + "\n", encoding="utf-8")
    return f"files:{path}/{{split}}.{{src}},{path}/{{split}}.{{tgt}}"


def test_fit_plan_with_steps_per_execution_has_one_exact_call_per_epoch():
    from keras_transformer.training import loop

    assert loop._fit_plan(0, 7, 3, 2) == [(0, 1, 3), (1, 2, 3), (2, 3, 1)]
    assert loop._fit_plan(130, 250, 100, 4) == [(1, 2, 70), (2, 3, 50)]
    assert loop._fit_plan(0, 5, 100, 2) == [(0, 1, 5)]
    assert loop._fit_plan(5, 5, 100, 2) == []
    assert loop._fit_plan(0, 250, 100, 1) == [(0, 3, 100)]  # one step per call: unchanged


def tensorboard_batch_steps(run_dir, tag="batch_loss"):
    steps = []
    for path in sorted(glob.glob(str(run_dir / "logs" / "train" / "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            steps += [event.step for value in event.summary.value if value.tag == tag]
    return sorted(steps)


def test_steps_per_execution_trains_exactly_the_same_steps(tmp_path, spm500, small_corpus):
    """With 2 steps per execution and odd epochs, a run still ends at --max-steps and its
    epochs at their own steps (the last execution of an epoch is cut short); its checkpoints
    are written where an execution crosses a multiple of --checkpoint-every and hold exactly
    the weights of a one-step-per-call run after that many steps."""
    one_dir, two_dir = new_run_dir(tmp_path / "one", spm500), new_run_dir(tmp_path / "two", spm500)
    for batch_tokens in (256, 224, 288, 320, 192):  # the first budget whose epoch has an odd number of batches
        options = {
            **BASE,
            "data": small_corpus,
            "batch_tokens": batch_tokens,
            "checkpoint_every": 2,
            "keep_checkpoints": 100,
        }
        epoch = TrainingData(
            training.TrainingArgs(output="unused", **options),
            Tokenizer(spm500),
            DataSpec.parse(small_corpus).load("train"),
            1,
            BASE["max_length"],
        ).batches_per_epoch()
        if epoch % 2 == 1 and epoch > 1:
            break
    assert epoch % 2 == 1 and epoch > 1, f"the test needs an odd epoch length, got {epoch}"
    runs = {}
    for name, run_dir, per_execution in (("one", one_dir, 1), ("two", two_dir, 2)):
        # 2 epochs and 1 step: an odd number, over two epoch ends.
        args = training.TrainingArgs(
            output=str(run_dir),
            **{
                **options,
                "max_steps": 2 * epoch + 1,
                "steps_per_execution": per_execution,
                "checkpoint_every": 1 if per_execution == 1 else 2,
            },
        )
        runs[name] = training.train(args)
    total = 2 * epoch + 1
    # Where each execution of 2 steps ends: every 2 steps in an epoch, and at the epoch's end.
    ends = sorted({min(e * epoch + k, (e + 1) * epoch, total) for e in range(3) for k in range(2, epoch + 2, 2)})
    assert ends[-1] == total
    one, two = runs["one"], runs["two"]
    assert one.step == two.step == total
    assert [int(row["step"]) for row in read_csv(two_dir / "steps.csv")] == ends
    assert [(int(r["epoch"]), int(r["step"])) for r in two.history] == [(0, epoch), (1, 2 * epoch), (2, total)]
    assert [(int(r["epoch"]), int(r["step"])) for r in one.history] == [(0, epoch), (1, 2 * epoch), (2, total)]
    expected_checkpoints = [s for i, s in enumerate(ends) if s == total or s // 2 > ([0] + ends)[i] // 2]
    assert checkpoint_steps(two_dir) == expected_checkpoints
    assert checkpoint_steps(one_dir) == list(range(1, total + 1))
    assert json.loads((two_dir / "backup" / "state.json").read_text())["step"] == total
    # The same seed and batches: the same weights, bit for bit, at every checkpoint and at the end.
    model = run_layout.build_model(run_layout.model_config_of_run(str(one_dir)))
    one_paths, two_paths = dict(training.list_checkpoints(str(one_dir))), dict(training.list_checkpoints(str(two_dir)))
    for step in expected_checkpoints:
        for a, b in zip(
            training.average_checkpoints([one_paths[step]], model),
            training.average_checkpoints([two_paths[step]], model),
        ):
            np.testing.assert_array_equal(a, b, err_msg=f"step {step}")
    for a, b in zip(one.model.get_weights(), two.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # TensorBoard's batch-level axis is the global step, not a count of executions.
    if run_callbacks.tensorboard_available():
        assert tensorboard_batch_steps(two_dir) == ends
        assert tensorboard_batch_steps(one_dir) == list(range(1, total + 1))


def test_a_streamed_corpus_trains_on_the_same_batches_in_one_fit_call_or_one_per_epoch(
    tmp_path, spm500, small_corpus, monkeypatch
):
    """80 pairs streamed (as if over the in-memory limit): with 2 steps per execution, each epoch
    is a fit call of its own, and the calls go on with one stream: the weights are those of the
    run that reads it in one call, bit for bit (not of a stream started anew at every epoch)."""
    from keras_transformer.training import stream

    monkeypatch.setattr(stream.data, "MAX_DEFAULT_POOL_SIZE", 40)
    options = {**BASE, "data": small_corpus, "batch_tokens": 256, "steps_per_epoch": 3, "max_steps": 7}
    runs = {}
    for per_execution in (1, 2):
        run_dir = new_run_dir(tmp_path / f"spe{per_execution}", spm500)
        runs[per_execution] = training.train(
            training.TrainingArgs(output=str(run_dir), **options, steps_per_execution=per_execution)
        )
    one, two = runs[1], runs[2]
    assert json.loads((tmp_path / "spe2" / "config.json").read_text())["data"]["streamed"]
    assert one.step == two.step == 7
    assert [(int(r["epoch"]), int(r["step"])) for r in two.history] == [(0, 3), (1, 6), (2, 7)]
    for a, b in zip(one.model.get_weights(), two.model.get_weights()):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------------
# Learned positions cap the output length
# ----------------------------------------------------------------------------------


M = 12


@pytest.fixture(scope="module")
def position_models():
    from keras_transformer import Transformer, TransformerConfig

    keras.utils.set_random_seed(0)
    models = {}
    for encoding in ("learned", "sinusoidal"):
        model = Transformer(
            TransformerConfig.tiny(vocab_size=64, max_length=M, num_layers=1, positional_encoding=encoding)
        )
        model.build()
        models[encoding] = model
    return models


# Sources of 10 and 4 tokens (within the position table), each + 50 > M.
SOURCES = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 3], [7, 8, 9, 3, 0, 0, 0, 0, 0, 0]]


@pytest.mark.parametrize(
    "search, options",
    [
        ("greedy", {}),
        ("greedy", {"use_cache": False}),
        ("greedy", {"max_length": 40}),
        ("beam", {"beam_size": 3}),
        ("beam", {"beam_size": 3, "return_all": True}),
    ],
)
def test_learned_positions_cap_the_output_length(position_models, search, options):
    """`output_limits`: with learned positions the output buffer is capped by the position table
    (`config.max_length` = M), also when source length + 50 (or `max_length`) is longer. With the
    end token forbidden, every output runs to the cap: exactly M tokens, and no error."""
    from keras_transformer.decoding import beam_search, greedy_search

    function = greedy_search if search == "greedy" else beam_search
    source = tf.constant(SOURCES, tf.int32)
    assert all(sum(t != 0 for t in s) + 50 > M for s in SOURCES) and source.shape[1] <= M
    token_ids, scores = function(position_models["learned"], source, min_length=1000, **options)
    token_ids = token_ids.numpy()
    assert token_ids.shape[-1] == M
    assert (token_ids != 0).all()  # every output is M tokens long (pad is never generated)
    assert np.isfinite(scores.numpy()).all()
    # Without the end token forbidden, nothing is longer either.
    free_ids, _ = function(position_models["learned"], source, **options)
    assert free_ids.shape[-1] <= M


def test_sinusoidal_positions_are_not_capped(position_models):
    """The cap is the learned table's: sinusoids run to each source's length + 50 (§6.1)."""
    from keras_transformer.decoding import greedy_search

    token_ids, _ = greedy_search(position_models["sinusoidal"], tf.constant(SOURCES, tf.int32), min_length=1000)
    lengths = (token_ids.numpy() != 0).sum(axis=-1)
    assert lengths.tolist() == [10 + 50, 4 + 50]
