"""`keras-transformer train`: which value a model option takes, and what a resumed run records.

The order (later wins): the preset, then the caller's defaults (the demo's
dropout 0), then `--set KEY=VALUE`, then the named flags (`--dropout`).
"""

import argparse
import json
import re
import shutil

import pytest
from conftest import TINY_NET

from keras_transformer import cli, training
from keras_transformer.cli import train as train_cli

DEMO_DEFAULTS = dict(overrides={"dropout": 0.0})  # a command's own default, as an example script may pass


def parsed(argv, defaults=None):
    parser = train_cli.add_training_arguments(argparse.ArgumentParser(), defaults)
    return train_cli.args_from_namespace(parser.parse_args(argv))


@pytest.mark.parametrize(
    "defaults, argv, dropout",
    [
        # The caller's default replaces the preset's 0.1 ...
        (DEMO_DEFAULTS, [], 0.0),
        # ... and --set replaces the caller's default (it used to be the other way round).
        (DEMO_DEFAULTS, ["--set", "dropout=0.3"], 0.3),
        # A named flag wins over --set, wherever each stands on the command line.
        (DEMO_DEFAULTS, ["--dropout", "0.2", "--set", "dropout=0.3"], 0.2),
        (DEMO_DEFAULTS, ["--set", "dropout=0.3", "--dropout", "0.2"], 0.2),
        (DEMO_DEFAULTS, ["--dropout", "0.2"], 0.2),
        # Without caller defaults: the preset's P_drop = 0.1 (§5.4), then --set, then the flag.
        (None, [], 0.1),
        (None, ["--set", "dropout=0.3"], 0.3),
        (None, ["--dropout", "0.2", "--set", "dropout=0.3"], 0.2),
    ],
)
def test_preset_then_defaults_then_set_then_named_flags(defaults, argv, dropout):
    from keras_transformer.config import TransformerConfig

    args = parsed(argv, defaults)
    assert args.model_config().dropout == dropout
    assert TransformerConfig.from_preset(args.preset, args.vocab_size).dropout == 0.1  # the preset's own value


def test_caller_defaults_and_set_combine_key_by_key():
    args = parsed(["--set", "num_layers=3", "--set", "layer_norm_epsilon=1e-5"], DEMO_DEFAULTS)
    assert args.overrides == {"dropout": 0.0, "num_layers": 3, "layer_norm_epsilon": 1e-5}
    config = args.model_config()
    assert (config.dropout, config.num_layers, config.layer_norm_epsilon) == (0.0, 3, 1e-5)
    # The last --set of a key wins; the named flag still beats both.
    args = parsed(["--set", "num_layers=3", "--set", "num_layers=5", "--num-layers", "2"], DEMO_DEFAULTS)
    assert args.overrides == {"dropout": 0.0, "num_layers": 2}


@pytest.mark.parametrize("argv, multiple", [([], 8), (["--pad-to-multiple-of", "1"], 1)])
def test_pad_to_multiple_of_reaches_the_training_args(argv, multiple):
    assert parsed(argv).pad_to_multiple_of == multiple


@pytest.mark.parametrize(
    "argv, minutes", [([], 10.0), (["--checkpoint-minutes", "0.5"], 0.5), (["--checkpoint-minutes", "none"], None)]
)
def test_checkpoint_minutes_reaches_the_training_args(argv, minutes):
    assert parsed(argv).checkpoint_minutes == minutes


@pytest.mark.parametrize("argv, steps", [([], 1), (["--accumulate-steps", "4"], 4)])
def test_accumulate_steps_reaches_the_training_args(argv, steps):
    assert parsed(argv).accumulate_steps == steps


def test_a_refused_accumulation_is_named_by_its_flag(capsys, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "multi30k", "--output", "run", "--accumulate-steps", "0"])
    assert raised.value.code == 2
    assert (
        capsys.readouterr().err == "keras-transformer train: --accumulate-steps 0: must be a positive integer, got 0.\n"
    )


def test_a_refused_training_value_is_named_by_its_flag(capsys, monkeypatch):
    """A `ParameterError` of `TrainingArgs` names the flag of the field (`--checkpoint-minutes`), in one line."""
    monkeypatch.delenv(cli.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "multi30k", "--output", "run", "--checkpoint-minutes", "-1"])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        "keras-transformer train: --checkpoint-minutes -1.0: must be a positive number of minutes or None, got -1.0.\n"
    )


@pytest.mark.parametrize("value", [0, -8, 2.5])
def test_pad_to_multiple_of_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="pad_to_multiple_of must be a positive integer"):
        training.TrainingArgs(pad_to_multiple_of=value)


def test_train_help_documents_the_order(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--set KEY=VALUE" in text
    assert re.search(r"Order\W.*?preset.*?(command|caller)'s defaults.*?--set.*?named flags", text), text


# A resumed run keeps its first options file; resumes.jsonl says what each resume changed.


def test_resume_keeps_config_json_and_appends_the_changes(tmp_path, spm500):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    shutil.copy(spm500, run_dir / "spm.model")
    options = dict(
        output=str(run_dir),
        preset="tiny",
        vocab_size=500,
        batch_tokens=512,
        max_length=32,
        checkpoint_every=1,
        log_every=1,
        warmup_steps=4,
        validation_split=None,
        verbose=0,
        overrides=TINY_NET,
    )
    first = training.train(training.TrainingArgs(max_steps=2, **options))
    assert first.step == 2
    config_bytes = (run_dir / "config.json").read_bytes()
    assert json.loads(config_bytes)["training"]["max_steps"] == 2
    assert not (run_dir / "resumes.jsonl").exists()  # a fresh run writes config.json only

    again = training.train(training.TrainingArgs(max_steps=4, **options))
    assert (again.resumed_from, again.step) == (2, 4)
    assert (run_dir / "config.json").read_bytes() == config_bytes  # the first run's options, byte for byte
    lines = (run_dir / "resumes.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 1
    resume = json.loads(lines[0])
    assert resume["step"] == 2
    assert resume["changed"] == {"max_steps": 4}  # only what differs from config.json
    assert resume["data"]["total_steps"] == 4


@pytest.mark.parametrize(
    "argv, average_last, average_fraction",
    [
        ([], 10, 0.2),  # a command's defaults: averaging over the final fifth
        (["--average-last", "1"], 1, None),  # no averaging: the default fraction goes with it
        (["--average-fraction", "none"], 10, None),
        (["--average-last", "5", "--average-fraction", "0.5"], 5, 0.5),
    ],
)
def test_a_default_average_fraction_applies_only_when_averaging(argv, average_last, average_fraction):
    args = parsed(argv, dict(average_last=10, average_fraction=0.2))
    assert (args.average_last, args.average_fraction) == (average_last, average_fraction)


def test_an_explicit_average_fraction_without_averaging_is_refused():
    with pytest.raises(ValueError, match="average_fraction"):
        parsed(["--average-last", "1", "--average-fraction", "0.2"], dict(average_last=10, average_fraction=0.2))


def test_help_shows_a_commands_own_defaults():
    parser = train_cli.add_training_arguments(
        argparse.ArgumentParser(), dict(epochs=40, average_last=10, average_fraction=0.2, validate_bleu_every=500)
    )
    text = " ".join(parser.format_help().split())
    for shown in ("training data (default 40)", "20 big; default 10)", "(default 0.2)", "TensorBoard); default 500"):
        assert shown in text
