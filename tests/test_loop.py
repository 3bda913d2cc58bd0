"""Training (keras_transformer.training), scores (evaluation) and the Multi30k example.

Tiny models only. The slow parts are two `keras-transformer train` processes
(one killed with SIGKILL after its first checkpoint, then the same command
again) shared by the resume and run-directory tests, an exact-resume check in
process, and the example script with a few steps.
"""

import glob
import importlib.util
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import TINY_NET, new_run_dir, read_csv

from keras_transformer import hardware, training
from keras_transformer import run_dir as run_layout
from keras_transformer.cli import train as train_cli
from keras_transformer.inference.evaluation import corpus_scores, format_scores
from keras_transformer.training import loop
from keras_transformer.training import run as training_run
from keras_transformer.training import strategy as training_strategy
from keras_transformer.training import stream as training_stream

ROOT = pathlib.Path(__file__).resolve().parent.parent


def cli_command():
    script = pathlib.Path(sys.executable).with_name("keras-transformer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "keras_transformer.cli"]


# ----------------------------------------------------------------------------------
# Kill and resume: one CLI run SIGKILLed after its first checkpoint, then the same command
# ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, spm500):
    run_dir = new_run_dir(tmp_path_factory.mktemp("runs") / "multi30k_tiny", spm500)
    train_argv = [
        "--preset",
        "tiny",
        "--vocab-size",
        "500",
        "--max-steps",
        "30",
        "--checkpoint-every",
        "5",
        "--average-last",
        "3",
        "--average-fraction",
        "0.25",
        "--warmup-steps",
        "10",
        "--log-every",
        "5",
        "--max-length",
        "64",
        "--batch-tokens",
        "2048",
        "--verbose",
        "2",
        "--output",
        str(run_dir),
    ]
    command = cli_command() + ["train"] + train_argv
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    first = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.monotonic() + 900  # catches a hang, not a slow machine
    try:
        while not glob.glob(str(run_dir / "checkpoints" / "ckpt-*.weights.h5")):
            assert first.poll() is None, f"train exited before its first checkpoint:\n{first.stdout.read()}"
            assert time.monotonic() < deadline, "no checkpoint after 900 s"
            time.sleep(0.1)
        first.send_signal(signal.SIGKILL)
    finally:
        first.kill()
        first_output = first.communicate()[0]
    assert first.returncode == -signal.SIGKILL
    killed_checkpoints = sorted(os.listdir(run_dir / "checkpoints"))
    second = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert second.returncode == 0, second.stdout + second.stderr
    return dict(
        run_dir=run_dir,
        first_output=first_output,
        killed_checkpoints=killed_checkpoints,
        output=second.stdout,
        train_argv=train_argv,
    )


def test_sigkilled_run_resumes_from_its_last_checkpoint(killed_and_resumed):
    output = killed_and_resumed["output"]
    match = re.search(r"^resumed from step (\d+)$", output, re.MULTILINE)
    assert match, output
    assert 5 <= int(match.group(1)) < 30
    assert "resumed from" not in killed_and_resumed["first_output"]
    run_dir = killed_and_resumed["run_dir"]
    history = read_csv(run_dir / "history.csv")
    assert [int(row["epoch"]) for row in history] == [0]  # no duplicate row from the killed run
    assert int(history[-1]["step"]) == 30
    steps = [int(row["step"]) for row in read_csv(run_dir / "steps.csv")]
    assert steps == sorted(set(steps)) and steps[-1] == 30
    checkpoints = [step for step, _ in training.list_checkpoints(run_dir)]
    assert checkpoints == [10, 15, 20, 25, 30]  # keeps max(--keep-checkpoints 5, --average-last 3)
    assert json.loads((run_dir / "backup" / "state.json").read_text())["step"] == 30


def test_run_directory_has_everything(killed_and_resumed):
    run_dir = killed_and_resumed["run_dir"]
    for name in ("config.json", "spm.model", "history.csv", "steps.csv", "curves.png", "model.keras"):
        assert (run_dir / name).is_file(), name
    assert glob.glob(str(run_dir / "logs" / "train" / "events.out.tfevents.*"))
    assert glob.glob(str(run_dir / "logs" / "validation" / "events.out.tfevents.*"))
    config = json.loads((run_dir / "config.json").read_text())
    assert config["model"]["num_layers"] == 2 and config["model"]["vocab_size"] == 500
    assert config["training"]["max_steps"] == 30 and config["data"]["spec"] == "multi30k"
    # Loss went down (steps.csv holds the mean loss of each 5 steps).
    losses = [float(row["loss"]) for row in read_csv(run_dir / "steps.csv")]
    assert losses[-1] < losses[0] - 0.5, losses
    row = read_csv(run_dir / "history.csv")[-1]
    for key in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate", "tokens_per_sec"):
        assert float(row[key]) > 0, key
    # model.keras is the mean of the checkpoints of the last quarter of the 30 steps (at most 3, §6.1):
    # steps 25 and 30 (20 < 22.5); load_run gives it back.
    model, tokenizer = training.load_run(str(run_dir))
    assert tokenizer.vocab_size == 500
    expected = training.average_checkpoints([p for s, p in training.list_checkpoints(run_dir) if s in (25, 30)])
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_average_checkpoints_command(killed_and_resumed, tmp_path):
    from keras_transformer import cli

    run_dir = killed_and_resumed["run_dir"]
    output = tmp_path / "avg2.weights.h5"
    assert cli.main(["average-checkpoints", str(run_dir), "--last", "2", "--output", str(output)]) == 0
    model = run_layout.build_model(run_layout.model_config_of_run(str(run_dir)))
    paths = [p for _, p in training.list_checkpoints(run_dir)[-2:]]
    weights = []
    for path in paths:
        model.load_weights(path)
        weights.append(model.get_weights())
    model.load_weights(str(output))
    for got, a, b in zip(model.get_weights(), *weights):
        np.testing.assert_allclose(got, (a.astype(np.float64) + b) / 2, rtol=1e-6, atol=1e-7)


def test_finished_run_started_again_trains_nothing(killed_and_resumed, capsys):
    import argparse

    run_dir = killed_and_resumed["run_dir"]
    history = (run_dir / "history.csv").read_text()
    parser = train_cli.add_training_arguments(argparse.ArgumentParser())
    args = train_cli.args_from_namespace(parser.parse_args(killed_and_resumed["train_argv"]))
    result = training.train(args)
    assert (result.resumed_from, result.step) == (30, 30)
    assert "nothing to train" in capsys.readouterr().out
    assert (run_dir / "history.csv").read_text() == history


# ----------------------------------------------------------------------------------
# In process
# ----------------------------------------------------------------------------------


def test_checkpoints_to_average_within_the_runs_final_fraction():
    every_50 = [(step, f"ckpt-{step}") for step in range(450, 851, 50)] + [(857, "ckpt-857")]
    choose = training.checkpoints_to_average
    # The newest K, whatever their steps (§6.1) ...
    assert choose(every_50, 857, 10) == [p for _, p in every_50]
    assert choose(every_50, 857, 3) == ["ckpt-800", "ckpt-850", "ckpt-857"]
    # ... or those of the last fifth of 857 steps (from step 685.6), still at most K.
    assert choose(every_50, 857, 10, 0.2) == ["ckpt-700", "ckpt-750", "ckpt-800", "ckpt-850", "ckpt-857"]
    assert choose(every_50, 857, 2, 0.2) == ["ckpt-850", "ckpt-857"]
    assert choose(every_50, 857, 10, 1.0) == [p for _, p in every_50]
    # Checkpoints after the last step (of a longer earlier run) are not the run's; an empty window keeps the newest.
    assert choose(every_50, 800, 10, 0.2) == ["ckpt-650", "ckpt-700", "ckpt-750", "ckpt-800"]
    assert choose(every_50, 857, 10, 0.001) == ["ckpt-857"]
    with pytest.raises(ValueError, match="average_fraction must be"):
        training.TrainingArgs(average_fraction=0.0)
    with pytest.raises(ValueError, match="average_fraction must be"):
        training.TrainingArgs(average_fraction=1.5)


@pytest.mark.parametrize("average_last", [0, 1])
def test_average_fraction_without_an_average_is_refused(average_last):
    """It chooses among the checkpoints `average_last` averages: without them it would do nothing."""
    with pytest.raises(
        ValueError,
        match=r"^average_fraction \(0.2\) chooses among .* average_last is "
        f"{average_last}.*average_fraction to None",
    ):
        training.TrainingArgs(average_fraction=0.2, average_last=average_last)
    assert training.TrainingArgs(average_fraction=0.2, average_last=2).average_fraction == 0.2


def test_average_checkpoints_is_the_elementwise_mean(tmp_path):
    from keras_transformer import Transformer, TransformerConfig

    model = Transformer(TransformerConfig.tiny(vocab_size=50, num_layers=1))
    model.build()
    rng = np.random.default_rng(0)
    drawn, paths = [], []
    for i in range(3):
        weights = [rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()]
        model.set_weights(weights)
        paths.append(str(tmp_path / f"ckpt-{i:08d}.weights.h5"))
        model.save_weights(paths[-1])
        drawn.append(weights)
    before = model.get_weights()
    averaged = training.average_checkpoints(paths, model)
    assert len(averaged) == len(before)
    for got, *parts in zip(averaged, *drawn):
        np.testing.assert_allclose(got, np.mean(parts, axis=0), rtol=1e-6, atol=1e-6)
    for got, want in zip(model.get_weights(), before):  # the model is left as it was
        np.testing.assert_array_equal(got, want)


def test_resumed_run_equals_uninterrupted_run(tmp_path, spm500):
    """Weights, optimizer state, learning-rate step and data position all survive a restart.

    A copy of the run directory taken right after the checkpoint of step 3 (what a
    run killed then leaves behind) is continued to step 8: it ends with exactly the
    weights of the run that was never interrupted. Step 3 is inside the first epoch.
    """
    import keras

    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=3,
        log_every=3,
        verbose=0,
        overrides=TINY_NET,
        max_steps=8,
    )
    whole_dir = new_run_dir(tmp_path / "whole", spm500)
    copy_dir = tmp_path / "copy"

    class CopyAtStep3(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 2:  # step 3: its checkpoint and backup are written
                shutil.copytree(whole_dir, copy_dir)

    whole = training.train(training.TrainingArgs(output=str(whole_dir), **options), callbacks=[CopyAtStep3()])
    resumed = training.train(training.TrainingArgs(output=str(copy_dir), **options))
    assert (whole.step, resumed.step, resumed.resumed_from) == (8, 8, 3)
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("signal_name", ["SIGTERM", "SIGINT"])
def test_a_signal_stops_training_with_a_checkpoint_that_resumes_exactly(tmp_path, spm500, signal_name):
    """SIGTERM or SIGINT at step 5 (sent by the run to itself: the test hook, not a timing race) ends
    the process after writing a checkpoint and backup at step 5, between the checkpoints of every 3
    steps; the same run started again goes on to step 8 with exactly the weights of a run never stopped."""
    from keras_transformer.training import callbacks as run_callbacks

    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=3,
        log_every=3,
        verbose=0,
        overrides=TINY_NET,
        max_steps=8,
    )
    whole = training.train(training.TrainingArgs(output=str(new_run_dir(tmp_path / "whole", spm500)), **options))
    stopped_dir = new_run_dir(tmp_path / "stopped", spm500)
    script = (
        "import json, sys\n"
        "from keras_transformer import training\n"
        "training.train(training.TrainingArgs(**json.loads(sys.argv[1])))\n"
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env[run_callbacks.SIGNAL_AT_STEP_ENVIRONMENT] = f"5:{signal_name}"
    stopped = subprocess.run(
        [sys.executable, "-c", script, json.dumps(dict(options, output=str(stopped_dir)))],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "TrainingInterrupted: " + signal_name + " at step 5" in stopped.stderr
    assert f"{signal_name}: stopped at step 5 with a checkpoint" in stopped.stdout
    assert json.loads((stopped_dir / "backup" / "state.json").read_text())["step"] == 5
    assert [step for step, _ in training.list_checkpoints(stopped_dir)] == [3, 5]
    assert not (stopped_dir / "model.keras").exists()
    resumed = training.train(training.TrainingArgs(output=str(stopped_dir), **options))
    assert (resumed.resumed_from, resumed.step) == (5, 8)
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ema", [None, 0.9])
def test_a_run_without_its_backup_resumes_from_its_newest_checkpoint_and_deletes_none(tmp_path, spm500, capsys, ema):
    """With `backup/` gone, the run goes on from its newest checkpoint with a new optimizer state,
    the schedule at that step (with `ema`, an average starting from the checkpoint's weights);
    no checkpoint is deleted."""
    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=3,
        log_every=3,
        verbose=0,
        overrides=TINY_NET,
        keep_checkpoints=10,
        ema=ema,
    )
    run_dir = new_run_dir(tmp_path / "run", spm500)
    training.train(training.TrainingArgs(output=str(run_dir), max_steps=6, **options))
    shutil.rmtree(run_dir / "backup")
    capsys.readouterr()
    resumed = training.train(training.TrainingArgs(output=str(run_dir), max_steps=9, **options))
    out = capsys.readouterr().out
    assert (resumed.resumed_from, resumed.step) == (6, 9)
    assert "ckpt-00000006.weights.h5 (step 6); the optimizer state is new" in out
    assert [step for step, _ in training.list_checkpoints(run_dir)] == [3, 6, 9]
    # The optimizer's step (and so the learning rate of §5.3) went on from 6.
    assert json.loads((run_dir / "backup" / "state.json").read_text())["iterations"] == 9
    if ema:
        # The final model, the moving average, is a mean of the weights since step 6 (it starts
        # from the checkpoint's weights, not from those the model was built with).
        checkpoints = dict(training.list_checkpoints(run_dir))
        at_6, at_9 = (run_layout.build_model(resumed.model.config) for _ in range(2))
        at_6.load_weights(checkpoints[6])
        at_9.load_weights(checkpoints[9])
        moved = sum(np.abs(a - b).max() for a, b in zip(at_6.get_weights(), at_9.get_weights()))
        off = sum(np.abs(a - b).max() for a, b in zip(resumed.model.get_weights(), at_9.get_weights()))
        assert off <= moved, (off, moved)


def test_time_budget_stops_at_a_checkpoint_and_counts_over_resumes(tmp_path, spm500, capsys, monkeypatch):
    """The budget ends training mid-run with a checkpoint at the last step; the
    same command again finds the budget spent (time is counted across processes).

    The budget's clock (`Run.clock`) is replaced by one that advances by `pace`
    seconds at the start of every step, so the steps are counted exactly,
    however fast the machine is.
    """
    import keras

    from keras_transformer.training.run import Run

    budget_seconds, pace = 10.0, 1.0
    clock = {"now": 1000.0}
    monkeypatch.setattr(Run, "clock", staticmethod(lambda: clock["now"]))

    class Paced(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock["now"] += pace

    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=1000,
        log_every=1000,
        verbose=0,
        overrides=TINY_NET,
        max_steps=100_000,
        time_budget=budget_seconds / 60,
        average_last=2,
    )
    run_dir = new_run_dir(tmp_path / "run", spm500)

    first = training.train(training.TrainingArgs(output=str(run_dir), **options), callbacks=[Paced()])
    out = capsys.readouterr().out
    assert first.step == 10  # the 10th one-second step reaches the 10 s budget
    assert "reached at step 10" in out
    assert [s for s, _ in training.list_checkpoints(run_dir)] == [10]
    state = json.loads((run_dir / "backup" / "state.json").read_text())
    assert state["step"] == 10 and state["training_seconds"] == pytest.approx(10.0)
    assert int(read_csv(run_dir / "steps.csv")[-1]["step"]) == 10

    clock["now"] += 3600  # time between the processes does not count
    again = training.train(training.TrainingArgs(output=str(run_dir), **options), callbacks=[Paced()])
    assert (again.resumed_from, again.step) == (10, 10)
    assert "already used its time budget" in capsys.readouterr().out

    # A larger budget continues the run from there, with the time already spent counted.
    more = training.train(
        training.TrainingArgs(output=str(run_dir), **dict(options, time_budget=2 * budget_seconds / 60)),
        callbacks=[Paced()],
    )
    assert (more.resumed_from, more.step) == (10, 20)
    state = json.loads((run_dir / "backup" / "state.json").read_text())
    assert state["training_seconds"] == pytest.approx(20.0)


def test_checkpoints_every_checkpoint_minutes_whatever_the_step_count(tmp_path, spm500, monkeypatch):
    """With checkpoints every 1000 steps, a minute per step and `checkpoint_minutes` 2.5, a resume
    point is written every third step (and at the last): a slow run loses at most those minutes.
    `Run.clock` advances a minute at the start of every step, so the steps are counted exactly."""
    import keras

    from keras_transformer.training.run import Run

    assert training.TrainingArgs().checkpoint_minutes == 10  # the paper's 10-minute checkpoints (§6.1)
    clock = {"now": 1000.0}
    monkeypatch.setattr(Run, "clock", staticmethod(lambda: clock["now"]))

    class Paced(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            clock["now"] += 60.0

    run_dir = new_run_dir(tmp_path / "run", spm500)
    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=1000,
        checkpoint_minutes=2.5,
        log_every=1000,
        verbose=0,
        overrides=TINY_NET,
        max_steps=7,
    )
    training.train(training.TrainingArgs(output=str(run_dir), **options), callbacks=[Paced()])
    assert [step for step, _ in training.list_checkpoints(run_dir)] == [3, 6, 7]


def test_bad_time_budget_and_precision_are_refused():
    import tensorflow as tf

    with pytest.raises(ValueError, match="time_budget"):
        training.TrainingArgs(time_budget=0)
    training_strategy.check_time_budget(training.TrainingArgs(time_budget=5), tf.distribute.get_strategy())
    with pytest.raises(ValueError, match="precision must be one of auto, float32"):
        training.TrainingArgs(precision="bfloat16")


def test_a_batch_multiple_the_replicas_cannot_share_is_refused_before_training(tmp_path):
    """Batches of a multiple of 3 would split unevenly over 2 replicas."""
    import types

    with pytest.raises(
        ValueError,
        match=r"^batch_multiple 3 is not a multiple of the 2 replicas: .* Give a "
        r"multiple of 2 \(e\.g\. 4\) or None",
    ) as refused:
        training_strategy.check_batch_multiple(3, 2)
    assert refused.value.parameter == "batch_multiple"
    for batch_multiple, replicas in ((None, 2), (4, 2), (2, 1), (8, 8)):
        training_strategy.check_batch_multiple(batch_multiple, replicas)
    # train() refuses it first: before the run directory, the vocabulary or any data.
    two_replicas = types.SimpleNamespace(num_replicas_in_sync=2)
    with pytest.raises(ValueError, match="batch_multiple 3 is not a multiple of the 2 replicas"):
        training.train(training.TrainingArgs(output=str(tmp_path / "run"), batch_multiple=3), strategy=two_replicas)
    assert not (tmp_path / "run").exists()


# A real MultiWorkerMirroredStrategy, in a fresh process (it configures collective ops for the whole
# process). Without TF_CONFIG it is a local, single-worker one: no server, no port.
MULTI_WORKER_TIME_BUDGET = """
import json
import tensorflow as tf
from keras_transformer import training
from keras_transformer.training import strategy as strategies

multi_worker = tf.distribute.MultiWorkerMirroredStrategy()
result = {"is_multi_worker": isinstance(multi_worker, tf.distribute.MultiWorkerMirroredStrategy)}
try:
    strategies.check_time_budget(training.TrainingArgs(time_budget=5), multi_worker)
    result["with_budget"] = "accepted"
except ValueError as error:
    result["with_budget"] = str(error)
strategies.check_time_budget(training.TrainingArgs(), multi_worker)  # no budget: accepted
result["without_budget"] = "accepted"
print(json.dumps(result))
"""


def test_time_budget_is_refused_with_multi_worker_strategy():
    """Multi-worker runs must stop at the same step on every worker: no clocks."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", CUDA_VISIBLE_DEVICES="")
    env.pop("TF_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-c", MULTI_WORKER_TIME_BUDGET], capture_output=True, text=True, env=env, timeout=240
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["is_multi_worker"] and result["without_budget"] == "accepted"
    assert "time_budget is not supported with MultiWorkerMirroredStrategy" in result["with_budget"]
    assert "Give none" in result["with_budget"]


def test_auto_precision_run_records_what_it_chose(tmp_path, spm500, capsys, monkeypatch):
    """`--precision auto` trains with what `auto_precision` chose (here a fixed, non-default choice),
    records it in config.json and prints it with the reason."""
    calls = []

    def fake_auto_precision(*args, **kwargs):
        calls.append(args)
        return "mixed_bfloat16", "a reason made up by the test"

    monkeypatch.setattr(hardware, "auto_precision", fake_auto_precision)
    run_dir = new_run_dir(tmp_path / "run", spm500)
    result = training.train(
        training.TrainingArgs(
            output=str(run_dir),
            preset="tiny",
            vocab_size=500,
            batch_tokens=1024,
            max_length=32,
            validation_split=None,
            max_steps=1,
            verbose=0,
            overrides=TINY_NET,
            precision="auto",
        )
    )
    assert len(calls) == 1 and result.step == 1
    config = json.loads((run_dir / "config.json").read_text())
    assert config["training"]["precision"] == "auto" and config["precision"] == "mixed_bfloat16"
    assert "mixed_bfloat16: --precision auto, a reason made up by the test" in capsys.readouterr().out


def test_resuming_with_another_model_is_refused(tmp_path, spm500):
    run_dir = new_run_dir(tmp_path / "run", spm500)
    args = training.TrainingArgs(output=str(run_dir), preset="tiny", vocab_size=500)
    (run_dir / "config.json").write_text(
        json.dumps({"model": args.model_config().to_dict(), "training": args.to_dict(), "data": {}})
    )
    other = training.TrainingArgs(
        output=str(run_dir), preset="tiny", vocab_size=500, batch_tokens=999, overrides={"num_layers": 3}
    )
    with pytest.raises(
        ValueError,
        match=r"^output .*run holds a run with a different model num_layers \(2 -> 3\); batch_tokens \(4096 -> 999\)",
    ):
        training_run.check_resume_config(str(run_dir), other, other.model_config())
    assert training_run.check_resume_config(str(run_dir), args, args.model_config()) is not None


@pytest.mark.parametrize(
    "change, message",
    [
        ({"warmup_steps": 100}, r"warmup_steps \(4000 -> 100\)"),
        ({"lr_scale": 2.0}, r"lr_scale \(1.0 -> 2.0\)"),
        ({"precision": "mixed_bfloat16"}, r"precision \('float32' -> 'mixed_bfloat16'\)"),
        ({"pad_to_multiple_of": 1}, r"pad_to_multiple_of \(8 -> 1\)"),
        ({"ema": 0.999}, r"ema \(None -> 0.999\)"),  # another optimizer: Keras would skip loading its state
    ],
)
def test_resuming_with_another_schedule_precision_or_batching_is_refused(tmp_path, spm500, change, message):
    """A resume that would change the learning rate, the precision or the batches is another experiment."""
    run_dir = new_run_dir(tmp_path / "run", spm500)
    args = training.TrainingArgs(output=str(run_dir), preset="tiny", vocab_size=500)
    (run_dir / "config.json").write_text(
        json.dumps({"model": args.model_config().to_dict(), "training": args.to_dict(), "data": {}})
    )
    other = training.TrainingArgs(**{**args.to_dict(), **change})
    with pytest.raises(ValueError, match=message):
        training_run.check_resume_config(str(run_dir), other, other.model_config())


def test_a_run_recorded_before_pad_to_multiple_of_resumes_only_with_its_buckets(tmp_path, spm500):
    """Such a run padded batches to multiples of 8; resuming it with other buckets would change its data."""
    run_dir = new_run_dir(tmp_path / "run", spm500)
    args = training.TrainingArgs(output=str(run_dir), preset="tiny", vocab_size=500)
    recorded = {k: v for k, v in args.to_dict().items() if k != "pad_to_multiple_of"}
    (run_dir / "config.json").write_text(
        json.dumps({"model": args.model_config().to_dict(), "training": recorded, "data": {}})
    )
    assert training_run.check_resume_config(str(run_dir), args, args.model_config()) is not None
    other = training.TrainingArgs(**{**args.to_dict(), "pad_to_multiple_of": 1})
    with pytest.raises(ValueError, match=r"pad_to_multiple_of \(8 -> 1\)"):
        training_run.check_resume_config(str(run_dir), other, other.model_config())


@pytest.mark.parametrize("multiple", [1, 8])
def test_training_batches_are_padded_to_the_buckets_of_pad_to_multiple_of(spm500, multiple):
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    args = training.TrainingArgs(output="unused", batch_tokens=512, max_length=48, pad_to_multiple_of=multiple)
    stream = training_stream.TrainingData(args, Tokenizer(spm500), data.load_dataset("multi30k", "val"), 1, 48)
    boundaries = data.default_bucket_boundaries(48, multiple=multiple)
    batches = list(stream._epoch_batches(0))
    assert len(batches) == stream.batches_per_epoch() > 0
    counted = training_stream.count_batches_per_epoch(stream.tensors, stream.tokenizer, 512, 48, 1, boundaries)
    assert stream.batches_per_epoch() == counted
    if multiple == 1:  # the epoch count follows the buckets: the default ones give another count here
        assert counted != training_stream.count_batches_per_epoch(stream.tensors, stream.tokenizer, 512, 48, 1)
    lengths = {int(b[1].shape[1]) for b in batches}
    assert lengths <= set(boundaries)
    if multiple == 1:
        assert lengths - set(data.default_bucket_boundaries(48, multiple=8))  # lengths only fine buckets have
    validation = list(stream.validation(data.load_dataset("multi30k", "val")))
    for (source, _target_in), target_out in batches + validation:
        # Each batch is padded to the smallest boundary that holds its longest pair.
        longest = max(
            int(np.max(np.sum(source.numpy() != 0, axis=1))), int(np.max(np.sum(target_out.numpy() != 0, axis=1)))
        )
        assert int(target_out.shape[1]) == min(b for b in boundaries if b >= longest)


def test_epoch_length_is_counted_exactly(spm500):
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    args = training.TrainingArgs(output="unused", batch_tokens=512, max_length=24)
    stream = training_stream.TrainingData(args, Tokenizer(spm500), data.load_dataset("multi30k", "val"), 2, 24)
    expected = stream.batches_per_epoch()
    batches = list(stream._epoch_batches(5))
    assert len(batches) == expected > 0
    assert all(b[1].shape[0] % 2 == 0 and b[1].shape[0] * b[1].shape[1] <= 512 for b in batches)
    # A stream started at step k continues the stream started at 0 (what a resume relies on).
    start = expected - 2
    full = [b[1].numpy() for b in stream.stream(0, expected).take(start + 4)]
    later = [b[1].numpy() for b in stream.stream(start, expected).take(4)]
    for a, b in zip(full[start:], later):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(full[0], full[expected]) or full[0].shape != full[expected].shape


def test_subword_sampling_segments_training_pairs_anew_but_not_validation(spm500):
    import tensorflow as tf

    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    text = data.load_dataset("multi30k", "val").take(300)

    def first_epoch(subword_sampling, seed=0):
        # max_length 96: no pair is too long, even segmented finer.
        args = training.TrainingArgs(
            output="unused", batch_tokens=1536, max_length=96, seed=seed, subword_sampling=subword_sampling
        )
        stream = training_stream.TrainingData(args, Tokenizer(spm500), text, 1, 96)
        targets = [row[row > 0].tolist() for b in stream._epoch_batches(0) for row in b[1].numpy()]
        validation = [b[1].numpy().tolist() for b in stream.validation(text.take(64))]
        return targets, validation

    plain, plain_validation = first_epoch(0.0)
    assert first_epoch(0.0) == (plain, plain_validation)  # deterministic without sampling
    sampled, sampled_validation = first_epoch(0.1)
    again, _ = first_epoch(0.1)
    assert sampled != plain and sampled != again
    # BPE-dropout: more, shorter pieces for nearly every sentence (rarely fewer: a dropped merge can let
    # others apply). Compared sentence by sentence (by its text): sampled lengths change which pairs fill
    # the first epoch's batches.
    tokenizer = Tokenizer(spm500)

    def pieces_per_sentence(targets):
        texts = tokenizer.detokenize(tf.ragged.constant(targets)).numpy()
        return dict(zip(texts, map(len, targets)))

    plain_pieces, sampled_pieces = pieces_per_sentence(plain), pieces_per_sentence(sampled)
    common = plain_pieces.keys() & sampled_pieces.keys()
    assert len(common) > 50
    assert sum(sampled_pieces[t] > plain_pieces[t] for t in common) > 0.8 * len(common)
    assert sampled_validation == plain_validation  # validation keeps the best segmentation
    with pytest.raises(ValueError, match="subword_sampling"):
        training.TrainingArgs(subword_sampling=1.5)


def test_fit_plan_finishes_an_interrupted_epoch_first():
    assert loop._fit_plan(0, 20, 100) == [(0, 1, 20)]
    assert loop._fit_plan(0, 250, 100) == [(0, 3, 100)]
    assert loop._fit_plan(130, 250, 100) == [(1, 2, 70), (2, 3, 50)]
    assert loop._fit_plan(130, 150, 100) == [(1, 2, 20)]
    assert loop._fit_plan(200, 450, 100) == [(2, 5, 100)]


def test_command_line_options_map_to_training_args():
    import argparse

    parser = train_cli.add_training_arguments(argparse.ArgumentParser())
    namespace = parser.parse_args(
        [
            "--preset",
            "base",
            "--num-layers",
            "4",
            "--dropout",
            "0.3",
            "--norm-first",
            "--set",
            "use_bias=true",
            "--set",
            "layer_norm_epsilon=1e-5",
            "--precision",
            "mixed_bfloat16",
            "--xla",
            "--max-steps",
            "100",
            "--warmup-steps",
            "50",
            "--lr-scale",
            "2",
            "--average-last",
            "5",
            "--validation-split",
            "none",
            "--data",
            "files:a.{src},b.{tgt}",
            "--time-budget",
            "12.5",
        ]
    )
    args = train_cli.args_from_namespace(namespace)
    assert args.overrides == {
        "num_layers": 4,
        "dropout": 0.3,
        "norm_first": True,
        "use_bias": True,
        "layer_norm_epsilon": 1e-5,
    }
    assert (args.precision, args.xla, args.max_steps, args.warmup_steps, args.lr_scale) == (
        "mixed_bfloat16",
        True,
        100,
        50,
        2.0,
    )
    assert args.validation_split is None and args.average_last == 5 and args.data == "files:a.{src},b.{tgt}"
    assert args.time_budget == 12.5
    assert train_cli.args_from_namespace(parser.parse_args(["--precision", "auto"])).precision == "auto"
    config = args.model_config()
    assert (config.num_layers, config.d_model, config.dropout, config.norm_first) == (4, 512, 0.3, True)
    defaults = train_cli.args_from_namespace(parser.parse_args([]))
    assert defaults.overrides == {} and defaults.warmup_steps == 4000 and defaults.precision == "float32"
    assert defaults.time_budget is None
    with pytest.raises(ValueError, match="precision"):
        training.TrainingArgs(precision="float64")


def test_streamed_corpora_batches(spm500):
    """tfds corpora are streamed: shuffled with a seed, repeated, epochs of --steps-per-epoch.

    (The data spec "tfds:fake" only selects streaming here; the text is Multi30k val.)"""
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    args = training.TrainingArgs(output="unused", data="tfds:fake", batch_tokens=512, max_length=24, steps_per_epoch=7)
    stream = training_stream.TrainingData(args, Tokenizer(spm500), data.load_dataset("multi30k", "val"), 1, 24)
    assert stream.streamed and stream.batches_per_epoch() == 7

    def rows(start_step, batches):
        seen = []
        for (source, _target_in), target_out in stream.stream(start_step, 7).take(batches):
            assert source.shape[0] == target_out.shape[0] > 0 and source.shape[0] * source.shape[1] <= 512
            seen.extend(tuple(row[row != 0]) for row in source.numpy())
        return seen

    first = rows(0, 120)
    # Repeated: 120 batches hold more sentences than the 1,014 pairs, and every one comes back.
    assert len(first) > 1014 and len(set(first)) < len(first)
    assert rows(0, 120) == first  # seeded: the same stream again
    # Shuffled: not in file order, and a resumed stream is reshuffled (seed + step), not replayed.
    from keras_transformer.data.corpora import read_lines

    in_order = [tuple(Tokenizer(spm500).encode(s)) + (3,) for s in read_lines("val", "en")[:20]]
    assert first[:20] != in_order
    resumed = rows(5, 10)
    assert resumed != first[: len(resumed)]


def test_a_streamed_corpus_goes_on_from_one_fit_call_to_the_next(monkeypatch):
    """A corpus of more pairs than one pool holds is streamed. The fit calls of a process (one
    per epoch with --steps-per-execution > 1) read one stream, in passes over all the pairs:
    not a new stream per call, each starting at the corpus's first pairs."""
    import tensorflow as tf

    monkeypatch.setattr(training_stream.data, "MAX_DEFAULT_POOL_SIZE", 1000)

    class NumberTokenizer:  # the pair "i" is the one token i + 4 (ids 0-3 are special)
        def tokenize(self, strings):
            return tf.RaggedTensor.from_tensor(tf.reshape(tf.strings.to_number(strings, tf.int32) + 4, [-1, 1]))

    numbers = [str(i) for i in range(3000)]
    text = tf.data.Dataset.from_tensor_slices((numbers, numbers))
    args = training.TrainingArgs(output="unused", data="files:a,b", batch_tokens=512, steps_per_epoch=10)

    def pairs(batches):
        seen = []
        for (source, _), _ in batches:
            source = source.numpy()
            seen.extend((source[source > 3] - 4).tolist())
        return seen

    stream = training_stream.TrainingData(args, NumberTokenizer(), text, 1, 64)
    assert stream.streamed
    calls = [pairs(stream.batches(10 * epoch, 10, 10)) for epoch in range(4)]  # 4 fit calls of 10 batches
    seen = sum(calls, [])
    assert len(seen) == 4 * 10 * 64  # 64 pairs per batch
    assert len(set(seen)) == len(seen)  # 2,560 different pairs of the 3,000: one pass, from all over the corpus
    # A resumed process starts a new stream (seeded by its step), not the first one again.
    resumed = training_stream.TrainingData(args, NumberTokenizer(), text, 1, 64)
    assert pairs(resumed.batches(20, 10, 1)) != calls[0][:64]


def _write_pairs(directory, split, sources, targets):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{split}.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
    (directory / f"{split}.de").write_text("\n".join(targets) + "\n", encoding="utf-8")


@pytest.mark.parametrize(
    "problem, message",
    [
        ("lines", r"files of the train split have different line counts: .*train.en has 3, .*train.de has 2"),
        ("utf8", r".*val.de: line 2: invalid UTF-8 .* \(val split\)"),
        ("missing", r".*val.en: no such file \(val split\)"),
        ("same_file", r"names one file \(.*/train.en and .*/\./train.en are one file\) for both sides of the train"),
        ("symlink", r"names one file \(.*/train.en and .*/train.de are one file\) for both sides of the train split"),
    ],
)
def test_data_files_are_checked_before_the_run_directory_is_made(tmp_path, problem, message):
    from keras_transformer.errors import ParameterError

    corpus = tmp_path / "corpus"
    _write_pairs(corpus, "train", ["a", "b", "c"], ["x", "y"] + ([] if problem == "lines" else ["z"]))
    if problem != "missing":
        _write_pairs(corpus, "val", ["a", "b"], ["x", "y"])
    if problem == "utf8":
        (corpus / "val.de").write_bytes(b"x\ncaf\xe9\n")
    if problem == "symlink":
        (corpus / "train.de").unlink()
        (corpus / "train.de").symlink_to(corpus / "train.en")
    output = tmp_path / "run"
    target = "{split}.en" if problem == "same_file" else "{split}.de"
    args = training.TrainingArgs(
        output=str(output), data=f"files:{corpus}/{{split}}.en,{corpus}/./{target}", preset="tiny", vocab_size=400
    )
    with pytest.raises(ParameterError, match=message) as raised:
        training.train(args)
    assert raised.value.parameter == "data"
    assert not output.exists()


@pytest.mark.parametrize("data", ["multi30k", "tfds:wmt14_translate/de-en"])
def test_a_named_corpus_in_one_language_is_refused_before_the_run_directory_is_made(tmp_path, data):
    from keras_transformer.errors import ParameterError

    output = tmp_path / "run"
    args = training.TrainingArgs(output=str(output), data=data, src="de", tgt="de", preset="tiny")
    with pytest.raises(ParameterError, match=rf"tgt must differ from the source language \(de\): data {data} would"):
        training.train(args)
    assert not output.exists()


def test_a_failed_start_leaves_no_directory_and_the_vocabulary_is_tied_to_its_data(tmp_path):
    """A start that fails after learning the vocabulary (here: a batch larger than the data) removes the
    directory it made; in a directory the user made, the vocabulary stays, and a rerun with other
    data is refused, naming both, instead of reusing it silently."""
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.errors import ParameterError

    sources, targets = read_lines("train", "en")[:1500], read_lines("train", "de")[:1500]
    _write_pairs(tmp_path / "a", "train", sources, targets)
    _write_pairs(tmp_path / "b", "train", sources[::-1], targets[::-1])

    def args(output, corpus):
        return training.TrainingArgs(
            output=str(output),
            data=f"files:{tmp_path}/{corpus}/train.en,{tmp_path}/{corpus}/train.de",
            validation_split=None,
            preset="tiny",
            vocab_size=400,
            batch_tokens=10**9,
        )

    with pytest.raises(ParameterError, match="no training batch"):
        training.train(args(tmp_path / "new", "a"))
    assert not (tmp_path / "new").exists()

    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(ParameterError, match="no training batch"):
        training.train(args(mine, "a"))
    assert (mine / "spm.model").exists()
    recorded = json.loads((mine / "spm.data.json").read_text())
    assert recorded["files"][0]["path"] == f"{tmp_path}/a/train.en"
    with pytest.raises(ParameterError) as raised:
        training.train(args(mine, "b"))
    message = str(raised.value)
    assert f"files:{tmp_path}/b/train.en,{tmp_path}/b/train.de en->de" in message
    assert f"is not the data the vocabulary {mine}/spm.model was learned on, files:{tmp_path}/a/train.en" in message
    assert f"delete {mine}/spm.model and {mine}/spm.data.json" in message


def test_files_without_split_are_not_validated_on_as_val(tmp_path, spm500):
    """`files:` paths without {split} are the same files for every split: the default
    --validation-split val would validate (and keep the best, stop early) on the training data."""
    plain = f"files:{tmp_path}/a.en,{tmp_path}/a.de"
    output = new_run_dir(tmp_path / "run", spm500)
    with pytest.raises(
        ValueError,
        match=r"^validation_split 'val' would read the training files .* "
        r"no \{split\}.*validation_split to None",
    ):
        training.train(training.TrainingArgs(output=str(output), data=plain, preset="tiny", vocab_size=500))
    from keras_transformer.data import DataSpec
    from keras_transformer.training.inputs import check_validation_files

    for data, split in (
        (plain, "train"),  # asked for by name
        (f"files:{tmp_path}/{{split}}.en,{tmp_path}/{{split}}.de", "val"),
    ):
        check_validation_files(DataSpec.parse(data), training.TrainingArgs(data=data, validation_split=split))


# ----------------------------------------------------------------------------------
# Scores
# ----------------------------------------------------------------------------------


def test_corpus_scores():
    references = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Tennis im Park."]
    perfect = corpus_scores(references, references)
    assert perfect["bleu"] == pytest.approx(100) and perfect["tok_bleu"] == pytest.approx(100)
    assert perfect["chrf"] == pytest.approx(100) and perfect["sentences"] == 2
    assert "tok:13a" in perfect["bleu_signature"] and "case:mixed" in perfect["bleu_signature"]
    assert "tok:none" in perfect["tok_bleu_signature"] and "moses-norm+moses-tok-de" in perfect["tok_bleu_signature"]
    assert perfect["chrf_signature"].startswith("nrefs:1")
    # Case differences count for sacreBLEU but not for the lower-cased tokenized BLEU.
    shouted = corpus_scores([r.upper() for r in references], references)
    assert shouted["bleu"] < 10 and shouted["tok_bleu"] == pytest.approx(100)
    lines = format_scores(perfect).splitlines()
    assert len(lines) == 3 and lines[0].startswith("BLEU (sacreBLEU, cased") and lines[2].startswith("chrF")
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_scores(references, references[:1])


# ----------------------------------------------------------------------------------
# The example
# ----------------------------------------------------------------------------------


def test_train_multi30k_example_runs_and_prints_bleu(tmp_path, spm500, capsys):
    spec = importlib.util.spec_from_file_location("train_multi30k", ROOT / "examples" / "train_multi30k.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    run_dir = new_run_dir(tmp_path / "run", spm500)
    report = example.main(
        [
            "--preset",
            "tiny",
            "--vocab-size",
            "500",
            "--max-steps",
            "6",
            "--checkpoint-every",
            "3",
            "--average-last",
            "2",
            "--average-fraction",
            "0.5",  # steps 3 and 6 (the demo's 0.2: step 6 alone)
            "--warmup-steps",
            "3",
            "--max-length",
            "48",
            "--batch-tokens",
            "2048",
            "--eval-limit",
            "4",
            "--samples",
            "2",
            "--verbose",
            "0",
            "--output",
            str(run_dir),
            "--export-dir",
            str(tmp_path / "saved_models"),
        ]
    )
    out = capsys.readouterr().out
    assert re.search(r"^BLEU \(sacreBLEU, cased, detokenized\) = \d+\.\d\d ", out, re.MULTILINE), out
    assert re.search(r"^BLEU \(lower-cased, Moses-tokenized\) = \d+\.\d\d ", out, re.MULTILINE), out
    assert re.search(r"^chrF = \d+\.\d\d ", out, re.MULTILINE), out
    assert "Averaged the last 2 checkpoints" in out and "SRC  " in out and "HYP  " in out
    assert report["sentences"] == 4 and report["step"] == 6
    hypotheses = (run_dir / "test2016.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hypotheses) == 4
    # The scores printed and saved are those of the written translations against test2016.
    from keras_transformer.data.corpora import read_lines

    expected = corpus_scores(hypotheses, read_lines("test2016", "de")[:4], lang="de")
    assert report["bleu"] == pytest.approx(expected["bleu"]) and report["tok_bleu"] == pytest.approx(
        expected["tok_bleu"]
    )
    assert json.loads((run_dir / "test2016_scores.json").read_text())["tok_bleu"] == report["tok_bleu"]
    assert report["export_path"] and os.path.isfile(os.path.join(report["export_path"], "saved_model.pb"))
    # The report says how, where and how long: a figure quoted from it names its machine and command.
    saved = json.loads((run_dir / "test2016_scores.json").read_text())
    assert saved["command"].startswith("python examples/train_multi30k.py --preset tiny")
    assert saved["training"]["max_steps"] == 6 and saved["epochs"] > 0
    assert saved["machine"]["cpu_count"] == os.cpu_count() and "flags" in saved["machine"]
    assert {key: saved["machine"][key] for key in hardware.cpu_identity()} == hardware.cpu_identity()
    assert saved["wall_seconds"] >= saved["train_seconds"] > 0 and saved["peak_rss_mb"] > 100
    assert saved["versions"]["tensorflow"]
    # The run trained with the demo's dropout for this CPU: 0 in float32, the paper's 0.1 in native bfloat16.
    native_bfloat16 = hardware.auto_precision(gpu_capabilities=[])[0] == "mixed_bfloat16"
    assert run_layout.read_config(str(run_dir))["model"]["dropout"] == (0.1 if native_bfloat16 else 0.0)
    # The export records the run's options, the machine and the scores of its model.
    info = json.loads(open(os.path.join(report["export_path"], "assets", "export.json")).read())
    assert info["training"]["max_steps"] == 6
    assert info["metadata"]["test2016"]["tok_bleu"] == report["tok_bleu"]
    assert info["metadata"]["machine"] == saved["machine"] and info["metadata"]["step"] == 6
    # ... and decodes as the scores were made (the demo's beam and length penalty).
    assert (info["decoding"]["beam_size"], info["decoding"]["alpha"]) == (report["beam"], report["alpha"])
    assert (info["metadata"]["beam"], info["metadata"]["alpha"]) == (report["beam"], report["alpha"])


def test_demo_recipe_reaches_the_run_and_flags_override_it():
    """The demo's recipe (chosen on validation) reaches the model and the run; the command line overrides it."""
    import argparse

    spec = importlib.util.spec_from_file_location("train_multi30k", ROOT / "examples" / "train_multi30k.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parser = example.build_parser()
    namespace = parser.parse_args([])
    demo = train_cli.args_from_namespace(namespace)
    config = demo.model_config()
    assert (config.num_layers, config.d_model, config.dropout, config.label_smoothing) == (3, 256, 0.1, 0.1)
    assert (demo.time_budget, demo.precision, demo.average_last, demo.keep_checkpoints) == (27.5, "auto", 10, 10)
    assert (demo.warmup_steps, demo.lr_scale, demo.validate_bleu_every, demo.average_fraction) == (400, 0.8, 500, 0.2)
    assert (namespace.beam, namespace.alpha) == (example.DEMO_BEAM_SIZE, example.DEMO_ALPHA)
    overridden = parser.parse_args(["--dropout", "0.3", "--average-last", "5", "--beam", "4", "--alpha", "0.6"])
    assert train_cli.args_from_namespace(overridden).model_config().dropout == 0.3
    assert (overridden.beam, overridden.alpha, train_cli.args_from_namespace(overridden).average_last) == (4, 0.6, 5)
    # The library and the CLI keep the paper's schedule: warmup 4000, no scale (§5.3).
    cli = train_cli.args_from_namespace(train_cli.add_training_arguments(argparse.ArgumentParser()).parse_args([]))
    assert (cli.warmup_steps, cli.lr_scale, cli.model_config().dropout) == (4000, 1.0, 0.1)
    assert cli.average_fraction is None  # the paper's "last K" (§6.1)
    off = train_cli.args_from_namespace(parser.parse_args(["--average-fraction", "none"]))
    assert off.average_fraction is None and off.average_last == 10


def test_demo_trains_without_dropout_where_its_budget_buys_few_epochs(capsys):
    """The demo's dropout follows the hardware's pace: 0 in float32 on a CPU (~6 epochs in 27.5 minutes),
    the paper's 0.1 with native 16-bit arithmetic or a GPU (~15 epochs); a dropout given wins."""
    spec = importlib.util.spec_from_file_location("train_multi30k", ROOT / "examples" / "train_multi30k.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parser = example.build_parser()

    def dropout(argv, native_precision, has_gpu=False):
        args = example.training_args(parser.parse_args(argv), native_precision=native_precision, has_gpu=has_gpu)
        return args.model_config().dropout

    assert dropout([], "float32") == 0.0  # an AVX2 CPU
    assert capsys.readouterr().out.startswith("Dropout 0 (the paper's is 0.1): in float32 on this CPU, 27.5 minutes")
    assert dropout(["--precision", "mixed_bfloat16"], "float32") == 0.0  # emulated bfloat16: slower still
    assert dropout(["--precision", "float32"], "mixed_bfloat16") == 0.0  # float32 where bfloat16 is native
    capsys.readouterr()
    assert dropout([], "mixed_bfloat16") == 0.1  # a CPU with AVX512_BF16
    assert dropout([], "mixed_float16", has_gpu=True) == 0.1
    assert dropout(["--precision", "float32"], "mixed_float16", has_gpu=True) == 0.1
    assert capsys.readouterr().out == ""
    # What the command line says wins, and a longer budget trains long enough for the paper's dropout.
    assert dropout(["--dropout", "0.1"], "float32") == 0.1
    assert dropout(["--set", "dropout=0.2"], "float32") == 0.2
    assert dropout(["--time-budget", "120"], "float32") == 0.1
    assert dropout(["--time-budget", "10"], "float32") == 0.0


def test_wmt14_example_has_the_papers_recipes(capsys):
    spec = importlib.util.spec_from_file_location("train_wmt14", ROOT / "examples" / "train_wmt14.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    base = example.main(["--dry-run"])
    assert (base.preset, base.max_steps, base.warmup_steps, base.batch_tokens, base.average_last) == (
        "base",
        100_000,
        4000,
        25000,
        5,
    )
    assert base.data == "tfds:wmt14_translate/de-en" and base.vocab_size == 37000
    big = example.main(["--recipe", "big", "--dry-run", "--precision", "mixed_float16"])
    assert (big.max_steps, big.average_last, big.precision) == (300_000, 20, "mixed_float16")
    config = big.model_config()
    assert (config.num_layers, config.d_model, config.num_heads, config.d_ff, config.dropout) == (
        6,
        1024,
        16,
        4096,
        0.3,
    )
    assert '"recipe": "big"' in capsys.readouterr().out


def test_example_flags_that_take_none_and_options_checked_before_training(tmp_path, capsys):
    """A command's default budget, validation BLEU or step count can be switched off ("none"); what would
    only fail once the model is trained is refused before."""
    spec = importlib.util.spec_from_file_location("train_multi30k", ROOT / "examples" / "train_multi30k.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    parser = example.build_parser()
    args = train_cli.args_from_namespace(
        parser.parse_args(["--time-budget", "none", "--validate-bleu-every", "none", "--validation-split", "none"])
    )
    assert (args.time_budget, args.validate_bleu_every, args.validation_split) == (None, None, None)
    for argv, said in (
        (["--eval-split", "test2017"], "invalid choice"),
        (["--data", "files:{split}.fr,{split}.de", "--src", "fr"], "--src fr: the demo scores Multi30k"),
        (["--eval-batch-size", "2000"], "--eval-batch-size must be between 1 and 1024"),
    ):
        with pytest.raises(SystemExit):
            example.main(argv + ["--output", str(tmp_path / "never")])
        assert said in capsys.readouterr().err
    assert not (tmp_path / "never").exists()  # refused before anything was trained
    wmt_spec = importlib.util.spec_from_file_location("train_wmt14", ROOT / "examples" / "train_wmt14.py")
    wmt = importlib.util.module_from_spec(wmt_spec)
    wmt_spec.loader.exec_module(wmt)
    assert wmt.main(["--dry-run", "--max-steps", "none", "--epochs", "3"]).max_steps is None
    with pytest.raises(SystemExit, match="is not a run directory"):
        wmt.main(["--eval-only", "--output", str(tmp_path / "missing")])


def test_pairs_longer_than_max_length_are_counted_in_a_warning(spm500, caplog):
    """Training leaves out pairs with a side longer than max_length; the user is told how many."""
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(spm500)
    pairs = training_stream.materialize(data.load_dataset("multi30k", "val"))
    lengths = [
        max(len(tokenizer.encode(s.decode())), len(tokenizer.encode(t.decode()))) + 1
        for s, t in zip(pairs[0].numpy(), pairs[1].numpy())
    ]
    too_long = sum(length > 16 for length in lengths)
    assert 0 < too_long < len(lengths)
    with caplog.at_level("WARNING", logger="keras_transformer.training.stream"):
        training_stream.count_batches_per_epoch(pairs, tokenizer, 512, 16, 1)
    assert f"{too_long} of {len(lengths)} training pairs" in caplog.text and "max_length 16" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="keras_transformer.training.stream"):
        training_stream.count_batches_per_epoch(pairs, tokenizer, 4096, max(lengths), 1)
    assert "training pairs" not in caplog.text
