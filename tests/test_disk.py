"""`training.disk`: a full disk stops training with a resumable state and one line, and leaves no temporary file."""

import errno
import json
import os
import shutil
from collections import namedtuple

import numpy as np
import pytest
from conftest import TINY_NET, new_run_dir

from keras_transformer import cli, training
from keras_transformer.cli import errors
from keras_transformer.training import disk

OPTIONS = dict(
    preset="tiny",
    vocab_size=500,
    batch_tokens=1024,
    max_length=32,
    validation_split=None,
    warmup_steps=4,
    checkpoint_every=3,
    checkpoint_minutes=None,
    log_every=3,
    verbose=0,
    overrides=TINY_NET,
    max_steps=8,
)
Usage = namedtuple("Usage", "total used free")


def test_free_space_is_checked_against_the_payload_and_its_margin(tmp_path, monkeypatch):
    payload = 50 * 2**20
    needed = disk.needed_bytes(payload)
    assert needed > payload
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, needed))
    disk.check_free_space(str(tmp_path), payload, "the checkpoint of step 3", "hint.")  # exactly enough
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10**12, 0, needed - 1))
    with pytest.raises(disk.DiskFullError) as raised:
        disk.check_free_space(str(tmp_path), payload, "the checkpoint of step 3", "hint.")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(tmp_path)
    free = f"{(needed - 1) // 2**20} MB free"
    assert raised.value.strerror == f"{free}, the checkpoint of step 3 needs about 78 MB: hint."


def test_a_write_that_fills_the_disk_leaves_no_temporary_file(tmp_path):
    partial = tmp_path / "tmp-1-state.weights.h5"

    def write():
        partial.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(disk.DiskFullError, match="no space left on the device writing the backup: hint"):
        with disk.stop_when_disk_full(str(tmp_path), [str(partial)], "the backup", "hint."):
            write()
    assert not partial.exists()
    # HDF5's wording, without an errno, is a full disk too; any other error passes unchanged.
    assert disk.is_disk_full(RuntimeError("Can't write data (file write failed: ... No space left on device)"))
    with pytest.raises(OSError, match="Permission denied"):
        with disk.stop_when_disk_full(str(tmp_path), [str(partial)], "the backup", "hint."):
            raise OSError(errno.EACCES, "Permission denied")


def test_state_bytes_is_about_what_a_backup_and_a_checkpoint_hold(tmp_path, spm500, monkeypatch):
    """The estimate, taken as training saves (the optimizer's moments built), is within 30% of the files."""
    from keras_transformer.training import run as training_run

    real_save = training_run.Run.save_backup
    estimates = []

    def save_backup(self, model, step):
        estimates.append((disk.state_bytes(model), disk.state_bytes(model, optimizer=False)))
        return real_save(self, model, step)

    monkeypatch.setattr(training_run.Run, "save_backup", save_backup)
    run = new_run_dir(tmp_path / "run", spm500)
    training.train(training.TrainingArgs(output=str(run), **dict(OPTIONS, max_steps=3)))
    backup = run / "backup" / json.loads((run / "backup" / "state.json").read_text())["weights"]
    checkpoint = training.list_checkpoints(run)[-1][1]
    (state, weights), size = estimates[-1], os.path.getsize(backup)
    assert 0.7 * size < state < 1.3 * size
    assert 0.7 * os.path.getsize(checkpoint) < weights < 1.3 * os.path.getsize(checkpoint)
    assert disk.needed_bytes(state) > size


def fill_disk_once_saved(monkeypatch, run):
    """`shutil.disk_usage` reports the real space until the run's first backup is written, then none."""
    real = shutil.disk_usage

    def usage(path):
        total, used, free = real(path)
        return Usage(total, used, 0 if (run / "backup" / "state.json").exists() else free)

    monkeypatch.setattr(shutil, "disk_usage", usage)


def test_a_full_disk_stops_training_with_the_last_checkpoint_and_resumes(tmp_path, spm500, monkeypatch):
    """The disk fills before the checkpoint of step 6: training stops with `DiskFullError` naming step 3, its
    backup and checkpoint whole and no temporary file; with space again, the same run goes on to step 8 with
    the weights of a run that never stopped."""
    whole = training.train(training.TrainingArgs(output=str(new_run_dir(tmp_path / "whole", spm500)), **OPTIONS))
    run = new_run_dir(tmp_path / "full", spm500)
    fill_disk_once_saved(monkeypatch, run)
    with pytest.raises(disk.DiskFullError) as raised:
        training.train(training.TrainingArgs(output=str(run), **OPTIONS))
    message = raised.value.strerror
    assert message.startswith("0 bytes free, the checkpoint of step 6 needs about ")
    assert message.endswith(
        f"the run stopped and resumes from step 3 ({run / 'backup' / 'state-00000003.weights.h5'}); "
        "free space and run the same command again."
    )
    assert json.loads((run / "backup" / "state.json").read_text())["step"] == 3
    assert [step for step, _ in training.list_checkpoints(run)] == [3]
    assert not [name for _, _, names in os.walk(run) for name in names if name.startswith("tmp-") or ".tmp-" in name]
    monkeypatch.undo()
    resumed = training.train(training.TrainingArgs(output=str(run), **OPTIONS))
    assert (resumed.resumed_from, resumed.step) == (3, 8)
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_disk_that_fills_while_writing_keeps_the_earlier_backup(tmp_path, spm500, monkeypatch):
    """The space check passes but the backup's write fails with ENOSPC half way (as another process filled
    the disk): its temporary file is removed, and the backup of step 3 stays the resume point."""
    from keras_transformer.training import run as training_run

    real_save = training_run.Run.save_backup
    calls = {"n": 0}

    def save_backup(self, model, step):
        calls["n"] += 1
        if calls["n"] == 1:
            return real_save(self, model, step)

        def half_write(path, *args, **kwargs):
            with open(path, "wb") as f:
                f.write(b"\x89HDF half")
            raise OSError(errno.ENOSPC, "No space left on device", path)

        monkeypatch.setattr(model, "save_weights", half_write)
        return real_save(self, model, step)

    monkeypatch.setattr(training_run.Run, "save_backup", save_backup)
    run = new_run_dir(tmp_path / "run", spm500)
    stopped = "writing the backup of step 6: the run stopped and resumes from step 3"
    with pytest.raises(disk.DiskFullError, match=stopped):
        training.train(training.TrainingArgs(output=str(run), **OPTIONS))
    assert json.loads((run / "backup" / "state.json").read_text())["step"] == 3
    assert sorted(os.listdir(run / "backup")) == ["state-00000003.weights.h5", "state.json"]


def test_the_command_line_reports_a_full_disk_in_one_line_with_status_1(monkeypatch, capsys):
    from keras_transformer.cli import train

    def full(args):
        raise disk.DiskFullError("/runs/a/backup", "no space left on the device writing the backup of step 6: hint.")

    monkeypatch.setattr(train, "run", full)
    monkeypatch.delenv(errors.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "multi30k", "--output", "run"])
    assert raised.value.code == 1
    assert capsys.readouterr().err == (
        "keras-transformer train: /runs/a/backup: no space left on the device writing the backup of step 6: hint.\n"
    )
