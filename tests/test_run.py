"""One training process's run directory (keras_transformer.training.run): resume points, backups, temporaries.

No model is trained here: the weights files are small HDF5 files written with
h5py, which is all `find_resume_point` reads.
"""

import dataclasses
import json
import os

import h5py
import numpy as np
import pytest

from keras_transformer import run_dir as run_layout
from keras_transformer.config import TransformerConfig
from keras_transformer.errors import ParameterError
from keras_transformer.training.options import RESUME_FIXED, RESUME_LEGACY_VALUES, TrainingArgs
from keras_transformer.training.run import ResumeError, ResumePoint, Run, check_resume_config


class _OneDevice:
    """What `Run` asks of a strategy: no cluster, so the chief."""

    cluster_resolver = None


def _weights_file(path, value=0.0):
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f.create_dataset("layers/dense/vars/0", data=np.full((64, 64), value, np.float32))
    return path


def _backup(run_dir, step, sha256=True):
    backup = run_dir / "backup"
    weights = _weights_file(backup / f"state-{step:08d}.weights.h5", step)
    state = {"step": step, "weights": weights.name, "training_seconds": 2.5, "iterations": step}
    if sha256:
        state["sha256"] = run_layout.file_sha256(weights)
    (backup / "state.json").write_text(json.dumps(state))
    return weights


def _checkpoint(run_dir, step):
    return _weights_file(run_dir / "checkpoints" / f"ckpt-{step:08d}.weights.h5", step)


def _overwrite_middle(path, size=4096):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + size] = b"\xff" * min(size, len(data) - middle)
    path.write_bytes(bytes(data))


def _run(run_dir):
    return Run(TrainingArgs(output=str(run_dir)), _OneDevice())


def _resume_point(run_dir):
    run = _run(run_dir)
    try:
        return run.find_resume_point()
    finally:
        run.close()


def test_resume_point_reads_the_backups_state_and_checks_its_weights(tmp_path):
    """`ResumePoint.read` names what `backup/state.json` records; `problem()` says whether its weights are there."""
    backup = tmp_path / "backup"
    assert ResumePoint.read(str(backup)) is None
    backup.mkdir()
    state = {"step": 7, "weights": "state-00000007.weights.h5", "training_seconds": 2.5, "iterations": 7}
    (backup / "state.json").write_text(json.dumps(state))
    point = ResumePoint.read(str(backup))
    assert point == ResumePoint(step=7, weights=str(backup / state["weights"]), training_seconds=2.5, iterations=7)
    assert point.problem() == f"{backup / state['weights']} is missing"
    _weights_file(backup / state["weights"])
    assert point.problem() is None
    del state["training_seconds"], state["iterations"]  # a backup that did not record them
    (backup / "state.json").write_text(json.dumps(state))
    assert ResumePoint.read(str(backup)) == ResumePoint(7, str(backup / state["weights"]), 0.0, None)
    (backup / "state.json").write_text('{"step": 7, "wei')  # cut short
    with pytest.raises(ResumeError, match=r"state.json is not a readable backup state"):
        ResumePoint.read(str(backup))


def test_an_intact_backup_is_the_resume_point(tmp_path):
    weights = _backup(tmp_path, 6)
    _checkpoint(tmp_path, 9)  # not the run's line (a backup is written before its checkpoint): left alone
    point = _resume_point(tmp_path)
    assert (point.step, point.weights, point.optimizer_state) == (6, str(weights), True)
    assert point.sha256 == run_layout.file_sha256(weights)


def test_a_missing_backup_resumes_from_the_newest_checkpoint_with_a_new_optimizer(tmp_path, capsys):
    for step in (3, 6):
        _checkpoint(tmp_path, step)
    point = _resume_point(tmp_path)
    assert (point.step, point.optimizer_state, point.iterations) == (6, False, 6)
    assert point.weights == str(tmp_path / "checkpoints" / "ckpt-00000006.weights.h5")
    out = capsys.readouterr().out
    assert "backup is missing" in out and "the optimizer state is new" in out
    assert [step for step, _ in run_layout.list_checkpoints(tmp_path)] == [3, 6]


def test_a_corrupt_backup_is_caught_by_its_checksum(tmp_path, capsys):
    """A few KB overwritten inside the backup's weights: HDF5 reads it, the checksum does not match."""
    weights = _backup(tmp_path, 9)
    _overwrite_middle(weights)
    with h5py.File(weights, "r") as f:  # h5py alone would trust it
        f["layers/dense/vars/0"][()]
    _checkpoint(tmp_path, 6)
    point = _resume_point(tmp_path)
    assert (point.step, point.optimizer_state) == (6, False)
    out = capsys.readouterr().out
    assert f"{weights} is corrupt" in out and "the optimizer state is new" in out


def test_corrupt_checkpoints_are_passed_over_and_with_none_intact_the_run_stops(tmp_path):
    weights = _backup(tmp_path, 9)
    weights.write_bytes(weights.read_bytes()[:1000])  # truncated
    oldest, newest = _checkpoint(tmp_path, 3), _checkpoint(tmp_path, 6)
    newest.write_bytes(newest.read_bytes()[:1000])
    assert _resume_point(tmp_path).step == 3
    oldest.write_bytes(b"not HDF5")
    with pytest.raises(ResumeError) as caught:
        _resume_point(tmp_path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{weights} is corrupt")
    assert f"delete {tmp_path / 'backup'} to train the run again from step 0" in message


def test_a_fresh_directory_has_no_resume_point(tmp_path):
    assert _resume_point(tmp_path / "new") is None


def test_stale_temporaries_of_a_killed_process_are_removed_at_start(tmp_path):
    package_temporaries = [
        "tmp-4242-model.keras",
        "config.json.tmp-4242",
        "history.csv.tmp-17",
        "backup/tmp-4242-state-00000010.weights.h5",
        "backup/state.json.tmp-4242",
        "checkpoints/tmp-4242-ckpt-00000010.weights.h5",
        "tmp-4242-spm-abc123/spm.model",
    ]
    users = ["tmp-notes.txt", "notes.tmp", "checkpoints/tmp.h5", "backup/mine.tmp-x"]
    for name in package_temporaries + users:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    _run(tmp_path).close()
    for name in package_temporaries:
        assert not (tmp_path / name).exists(), name
    assert not (tmp_path / "tmp-4242-spm-abc123").exists()
    for name in users:
        assert (tmp_path / name).exists(), name


def test_checkpoint_rotation_keeps_checkpoints_past_the_step(tmp_path, monkeypatch):
    """Rotation deletes the run's own older checkpoints only, never one past its step."""
    import pathlib

    from keras_transformer.training import run as run_module

    run = _run(tmp_path)
    run.args.keep_checkpoints = 2
    for step in (1, 2, 3, 50):
        _checkpoint(tmp_path, step)
    monkeypatch.setattr(run, "save_backup", lambda model, step: None)
    monkeypatch.setattr(run_module, "save_model_weights", lambda model, path: _weights_file(pathlib.Path(path)))
    monkeypatch.setattr(run_module.disk, "state_bytes", lambda model, optimizer=True: 0)  # no model to measure
    run.save_checkpoint(model=None, step=4)
    assert [step for step, _ in run_layout.list_checkpoints(tmp_path)] == [3, 4, 50]


def test_a_second_process_on_the_same_run_directory_is_refused_with_the_holders_pid(tmp_path):
    """A subprocess holds the lock: this process is refused at once, and takes it once the holder is gone."""
    import subprocess
    import sys

    from keras_transformer.training.lock import RunInUseError

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from keras_transformer.training.lock import RunLock; "
            f"RunLock({str(tmp_path)!r}).acquire(); print('locked', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError) as caught:
            _run(tmp_path)
        message = str(caught.value)
        assert f"{tmp_path} is in use by another training process (pid {holder.pid})" in message
        assert "\n" not in message
        assert not (tmp_path / "checkpoints").exists()  # refused before writing anything
    finally:
        holder.kill()  # SIGKILL: the kernel releases the lock
        holder.wait()
    run = _run(tmp_path)
    assert (tmp_path / ".lock").read_text().strip() == str(os.getpid())
    run.close()
    _run(tmp_path).close()  # released: taken again


def test_an_unstarted_directory_is_removed_only_if_it_holds_nothing_but_what_a_start_writes(tmp_path):
    for extra in (None, "notes.txt", "checkpoints/ckpt-00000001.weights.h5"):
        run_dir = tmp_path / str(extra).replace("/", "_")
        run = _run(run_dir)
        for name in ("spm.model", "spm.vocab", "spm.data.json", "config.json", "config.json.tmp-12"):
            (run_dir / name).write_text("x")
        if extra:
            (run_dir / extra).write_text("mine")
        run.close()
        run.remove_unstarted_directory()
        assert run_dir.exists() == (extra is not None), extra


# The options a resume must keep, each with another valid value: what is trained on (the data, its
# vocabulary and segmentation, the batches and their order), the schedule of §5.3 (a step would mean
# another learning rate), the precision, the moving average (another optimizer state) and the loss
# (R-Drop's). A new option goes either here (and into `options.RESUME_FIXED`) or into RESUME_MAY_CHANGE.
RESUME_FIXED_CHANGES = {
    "data": "tfds:wmt14_translate/de-en",
    "src": "fr",
    "tgt": "fr",
    "vocab_size": 1000,
    "subword_sampling": 0.1,
    "batch_tokens": 999,
    "accumulate_steps": 2,
    "pad_to_multiple_of": 1,
    "seed": 1,
    "batch_multiple": 2,
    "max_length": 64,
    "warmup_steps": 100,
    "lr_scale": 2.0,
    "cooldown": 0.5,
    "precision": "mixed_bfloat16",
    "ema": 0.999,
    "rdrop_alpha": 5.0,
}

# The options a resume may change: how long the run goes on, how it is carried out (compilation,
# checkpoints, logs), what is validated and how the final weights are chosen, and the starting point
# (read on a fresh start only).
RESUME_MAY_CHANGE = {
    "epochs": 3,
    "max_steps": 10,
    "steps_per_epoch": 5,
    "time_budget": 5.0,
    "xla": True,
    "checkpoint_every": 7,
    "checkpoint_minutes": None,
    "keep_checkpoints": 2,
    "average_last": 3,
    "average_fraction": 0.5,
    "validation_split": None,
    "validate_every": 2,
    "validate_bleu_every": 100,
    "bleu_search": "beam",
    "keep_best": True,
    "early_stopping_patience": 3,
    "log_every": 5,
    "steps_per_execution": 4,
    "verbose": 0,
    "init_from": "another-run",
    "resume_optimizer": True,
}
# What a changed option needs to be valid (the values of other options it depends on).
NEEDS = {
    "average_fraction": {"average_last": 3},
    "keep_best": {"validate_bleu_every": 100},
    "early_stopping_patience": {"validate_bleu_every": 100},
    "resume_optimizer": {"init_from": "another-run"},
}

# Every field of the model configuration, with another valid value for the tiny preset.
MODEL_CHANGES = {
    "vocab_size": 1000,
    "num_layers": 3,
    "d_model": 128,
    "num_heads": 8,
    "d_ff": 128,
    "key_dim": 8,
    "value_dim": 8,
    "dropout": 0.3,
    "attention_dropout": 0.1,
    "label_smoothing": 0.2,
    "norm_first": True,
    "share_embeddings": False,
    "positional_encoding": "learned",
    "max_length": 64,
    "layer_norm_epsilon": 1e-5,
    "activation": "gelu",
    "use_bias": True,
}


def _started_run(run_dir, recorded=None):
    """TrainingArgs of a run recorded in `run_dir/config.json` (its `training` options: `recorded`, or all)."""
    args = TrainingArgs(output=str(run_dir), preset="tiny", vocab_size=500)
    run_dir.mkdir(parents=True, exist_ok=True)
    training = args.to_dict() if recorded is None else recorded(args.to_dict())
    (run_dir / "config.json").write_text(
        json.dumps({"model": args.model_config().to_dict(), "training": training, "data": {}})
    )
    return args


def _resumed(args, **changes):
    return TrainingArgs(**{**args.to_dict(), **changes})


def _refusal(run_dir, args):
    with pytest.raises(ParameterError) as caught:
        check_resume_config(str(run_dir), args, args.model_config())
    error = caught.value
    assert error.parameter == "output" and "\n" not in str(error)
    assert str(error).startswith(f"output {run_dir} holds a run with a different ")
    return str(error)


def test_every_option_is_either_fixed_or_free_on_resume():
    """Each TrainingArgs field is classified: the model's (compared as its config), fixed, or free to change.

    The fixed ones are `options.RESUME_FIXED` exactly: an option added without deciding whether a resume may
    change it fails here.
    """
    fields = {f.name for f in dataclasses.fields(TrainingArgs)}
    model_options = {"preset", "overrides"}  # compared through the model configuration
    assert set(RESUME_FIXED) == set(RESUME_FIXED_CHANGES)
    assert not set(RESUME_FIXED) & set(RESUME_MAY_CHANGE)
    assert fields - {"output"} == set(RESUME_FIXED) | set(RESUME_MAY_CHANGE) | model_options
    assert {f.name for f in dataclasses.fields(TransformerConfig)} == set(MODEL_CHANGES)


@pytest.mark.parametrize("option", RESUME_FIXED)
def test_a_resume_that_changes_a_fixed_option_is_refused_naming_it(tmp_path, option):
    args = _started_run(tmp_path / "run")
    value = RESUME_FIXED_CHANGES[option]
    message = _refusal(tmp_path / "run", _resumed(args, **{option: value}))
    assert f"{option} ({getattr(args, option)!r} -> {value!r})" in message


@pytest.mark.parametrize("option", RESUME_LEGACY_VALUES)
def test_a_run_recorded_before_an_option_existed_resumes_only_with_its_legacy_value(tmp_path, option):
    args = _started_run(tmp_path / "run", lambda t: {k: v for k, v in t.items() if k != option})
    legacy = RESUME_LEGACY_VALUES[option]
    assert check_resume_config(str(tmp_path / "run"), _resumed(args, **{option: legacy}), args.model_config())
    value = RESUME_FIXED_CHANGES[option]
    assert value != legacy
    message = _refusal(tmp_path / "run", _resumed(args, **{option: value}))
    assert f"{option} ({legacy!r} -> {value!r})" in message


@pytest.mark.parametrize("field", MODEL_CHANGES)
def test_a_resume_that_changes_the_model_configuration_is_refused_naming_the_field(tmp_path, field):
    args = _started_run(tmp_path / "run")
    value = MODEL_CHANGES[field]
    before = args.model_config().to_dict()[field]
    assert before != value
    changed = _resumed(args, vocab_size=value) if field == "vocab_size" else _resumed(args, overrides={field: value})
    assert changed.model_config().to_dict()[field] == value
    message = _refusal(tmp_path / "run", changed)
    assert f"model {field} ({before!r} -> {value!r})" in message


def test_a_resume_with_another_preset_is_refused_naming_the_fields_it_changes(tmp_path):
    args = _started_run(tmp_path / "run")
    message = _refusal(tmp_path / "run", _resumed(args, preset="base"))
    assert "model d_model (64 -> 512)" in message and "model num_layers (2 -> 6)" in message


@pytest.mark.parametrize("option", RESUME_MAY_CHANGE)
def test_a_resume_may_change_how_long_and_how_a_run_goes_on(tmp_path, option):
    args = _started_run(tmp_path / "run")
    changes = {**NEEDS.get(option, {}), option: RESUME_MAY_CHANGE[option]}
    assert all(getattr(args, k) != v for k, v in changes.items())
    saved = check_resume_config(str(tmp_path / "run"), _resumed(args, **changes), args.model_config())
    assert saved["training"] == args.to_dict()


def test_a_new_run_directory_has_nothing_to_check(tmp_path):
    args = TrainingArgs(output=str(tmp_path / "new"), preset="tiny", vocab_size=500)
    assert check_resume_config(str(tmp_path / "new"), args, args.model_config()) is None
