"""One set of flags across the commands: --model, --progress, --precision's default, help lines, flag names."""

import argparse
import os
import shutil

import pytest

from keras_transformer import cli
from keras_transformer.cli import export as export_cli

SENTENCES = ["A dog runs on the beach.", "Two men are talking."]


def subcommands():
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_every_command_has_a_description_and_every_flag_its_default():
    for name, parser in subcommands().items():
        assert parser.description, name
        for action in parser._actions:
            if (
                isinstance(action, (argparse._HelpAction, argparse._StoreTrueAction))
                or action.help == argparse.SUPPRESS
            ):
                continue
            text = (action.help or "").lower()
            said = ("default" in text, "required" in text, "deprecated" in text, action.required)
            assert any(said), (name, action.option_strings or action.dest, text)


def test_train_epochs_help_says_what_it_trains():
    train = subcommands()["train"]
    epochs = next(a for a in train._actions if "--epochs" in a.option_strings)
    assert "(default 10 when --max-steps is not given)" in epochs.help and "None" not in epochs.help


def test_train_and_export_share_the_precision_default():
    commands = subcommands()
    train = next(a for a in commands["train"]._actions if "--precision" in a.option_strings)
    export = next(a for a in commands["export"]._actions if "--precision" in a.option_strings)
    assert train.default == export_cli.RUN_EXPORT_PRECISION == "float32"
    assert "export's default" in train.help and "as train's default" in export.help


def test_translate_and_evaluate_share_one_progress_switch(tiny_run_dir, tmp_path, capsys):
    src = tmp_path / "src.en"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    common = ["--model", tiny_run_dir, "--max-extra-length", "2"]
    runs = {
        ("translate",): ["translate", *common, "--input", str(src)],
        ("translate", "--no-progress"): ["translate", *common, "--input", str(src), "--no-progress"],
        ("translate", "--quiet"): ["translate", *common, "--input", str(src), "--quiet"],  # the old flag
        ("evaluate",): ["evaluate", *common, "--src", str(src), "--ref", str(src)],
        ("evaluate", "--no-progress"): ["evaluate", *common, "--src", str(src), "--ref", str(src), "--no-progress"],
        ("evaluate", "--progress"): ["evaluate", *common, "--src", str(src), "--ref", str(src), "--progress"],
    }
    for key, argv in runs.items():
        assert cli.main(argv) == 0
        err = capsys.readouterr().err
        shown = "/sentence" in err
        assert shown == (len(key) == 1 or key[1] == "--progress"), (key, err)


def test_flags_that_conflict_are_named_as_typed(tiny_run_dir, capsys):
    for argv, line in (
        (
            ["--sampling-topk", "10", "--n-best", "2"],
            "keras-transformer translate: --n-best 2: needs beam search, not sampling (--sampling-topk).",
        ),
        (
            ["--batch-size", "0"],
            "keras-transformer translate: --batch-size 0: must be between 1 and 1024, got 0.",
        ),
    ):
        with pytest.raises(SystemExit) as raised:
            cli.main(["translate", "--model", tiny_run_dir, *argv, "A dog."])
        assert raised.value.code == 2
        assert capsys.readouterr().err == line + "\n"


@pytest.fixture
def run_with_one_checkpoint(tiny_run_dir, tmp_path):
    import keras

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir, run)
    (run / "checkpoints").mkdir()
    model = keras.saving.load_model(run / "model.keras", compile=False)
    model.save_weights(run / "checkpoints" / "ckpt-00000010.weights.h5")
    return str(run)


def test_average_checkpoints_takes_model_and_warns_when_it_has_fewer(run_with_one_checkpoint, tmp_path, capsys):
    output = tmp_path / "avg.keras"
    assert cli.main(["average-checkpoints", "--model", run_with_one_checkpoint, "--output", str(output)]) == 0
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"keras-transformer average-checkpoints: warning: --last 5, but only 1 checkpoint to average in "
        f"{run_with_one_checkpoint}."
    ]
    assert output.exists()
    os.remove(output)
    # The positional form still works, and says nothing with --last 1.
    assert cli.main(["average-checkpoints", run_with_one_checkpoint, "--last", "1", "--output", str(output)]) == 0
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit, match="give the model once, with --model"):
        cli.main(["average-checkpoints", run_with_one_checkpoint, "--model", str(tmp_path)])
    with pytest.raises(SystemExit, match="give the model with --model PATH"):
        cli.main(["average-checkpoints"])
    assert "deprecated: give --model RUN_DIR" in subcommands()["average-checkpoints"].format_help()


def test_export_takes_model_and_prints_its_precision(tiny_run_dir, tmp_path, capsys):
    base = tmp_path / "exported"
    argv = ["--output", str(base), "--beam", "1", "--max-extra-length", "2", "--no-warmup"]
    assert cli.main(["export", "--model", tiny_run_dir, *argv]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == str(base / "1")
    assert captured.err.splitlines() == ["precision: float32"]
    assert cli.main(["export", tiny_run_dir, *argv, "--precision", "bfloat16"]) == 0  # positional, deprecated
    captured = capsys.readouterr()
    assert captured.out.splitlines()[-1] == str(base / "2")
    assert captured.err.splitlines() == ["precision: bfloat16"]
    assert "deprecated: give --model RUN_DIR" in subcommands()["export"].format_help()
