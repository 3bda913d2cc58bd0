"""One error style for every command: `keras-transformer COMMAND: what went wrong, and where` on stderr.

Exit status 2 for bad input or usage, 1 for a failure at run time, 130 for Ctrl-C; a traceback only
with `--debug` or `KERAS_TRANSFORMER_DEBUG=1`. Most of these run the command as the console script
does, in a process of its own.
"""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from keras_transformer import cli
from keras_transformer.cli import errors

CLI = [sys.executable, "-m", "keras_transformer.cli"]
ENV = {k: v for k, v in os.environ.items() if k not in ("KERAS_TRANSFORMER_DEBUG",)}


def default_sigint():
    """In the child: SIGINT's default action, which Python turns into KeyboardInterrupt (a shell's background
    job, such as a test run started with `&`, inherits SIGINT ignored, and Python then leaves it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_command(argv, env=None, **kwargs):
    return subprocess.run(CLI + argv, capture_output=True, text=True, env=env or ENV, timeout=300, **kwargs)


def error_lines(stderr):
    """stderr's lines, without TensorFlow's start-up logging (tested in test_cli_quiet.py)."""
    return [line for line in stderr.splitlines() if line.startswith("keras-transformer") or "Traceback" in line]


def test_train_refuses_missing_directory_and_empty_data_files_in_one_line(tmp_path):
    (tmp_path / "empty.en").write_text("")
    (tmp_path / "empty.de").write_text("")
    (tmp_path / "adir").mkdir()
    for files, path, problem in (
        ("nope.en,nope.de", "nope.en", ": no such file"),
        ("adir,adir", "adir", " is a directory, not a file"),
        ("empty.en,empty.de", "empty.en", " is empty"),
    ):
        proc = run_command(
            ["train", "--data", f"files:{files}", "--validation-split", "none", "--output", "run"], cwd=tmp_path
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.splitlines()[-1] == (
            f"keras-transformer train: --data files:{files}: {path}{problem} (train split)."
        )
        assert not (tmp_path / "run").exists()  # refused before the run directory is made
    (tmp_path / "one.en").write_text("a dog\n")
    proc = run_command(
        ["train", "--data", "files:one.en,./one.en", "--validation-split", "none", "--output", "run"], cwd=tmp_path
    )
    assert (proc.returncode, error_lines(proc.stderr)) == (
        2,
        [
            "keras-transformer train: --data files:one.en,./one.en: names one file (one.en and ./one.en are one "
            "file) for both sides of the train split: each line would be paired with itself."
        ],
    )
    assert not (tmp_path / "run").exists()


def test_train_refuses_an_unknown_field_of_a_files_template_in_one_line(tmp_path):
    proc = run_command(["train", "--data", "files:{lang}.en,{lang}.de", "--output", "run"], cwd=tmp_path)
    assert (proc.returncode, error_lines(proc.stderr)) == (
        2,
        [
            "keras-transformer train: --data files:{lang}.en,{lang}.de: files: path '{lang}.en' has {lang}; "
            "a path may contain {split}, {src} and {tgt} (write a literal brace as '{{')"
        ],
    )
    assert not (tmp_path / "run").exists()


def test_debug_flag_and_environment_add_the_traceback(tmp_path):
    argv = ["train", "--data", "files:nope.en,nope.de", "--validation-split", "none", "--output", "run"]
    line = "keras-transformer train: --data files:nope.en,nope.de: nope.en: no such file (train split)."
    for flags, env in ((["--debug"], ENV), ([], dict(ENV, KERAS_TRANSFORMER_DEBUG="1"))):
        proc = run_command(flags + argv, env=env, cwd=tmp_path)
        assert proc.returncode == 2
        assert "Traceback (most recent call last)" in proc.stderr
        assert proc.stderr.splitlines()[-1] == line


def test_average_checkpoints_and_export_of_a_directory_that_is_no_run(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run_command(["average-checkpoints", str(tmp_path / "empty")])
    assert (proc.returncode, error_lines(proc.stderr)) == (
        2,
        [f"keras-transformer average-checkpoints: no checkpoints in {tmp_path / 'empty' / 'checkpoints'}."],
    )
    proc = run_command(["export", str(tmp_path / "empty"), "--output", str(tmp_path / "out")])
    assert proc.returncode == 2
    assert error_lines(proc.stderr) == [
        f"keras-transformer export: {tmp_path / 'empty' / 'spm.model'}; No such file or directory"
    ]


def test_a_failure_at_run_time_is_one_line_with_status_1(monkeypatch, capsys):
    from keras_transformer.cli import translate

    def broken(args):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(translate, "run", broken)
    monkeypatch.delenv(errors.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "--model", "x", "a"])
    assert raised.value.code == 1 and str(raised.value) == "translate: RuntimeError: boom"
    assert capsys.readouterr().err == "keras-transformer translate: RuntimeError: boom\n"
    with pytest.raises(SystemExit):
        cli.main(["--debug", "translate", "--model", "x", "a"])
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith("\nkeras-transformer translate: RuntimeError: boom\n")


def test_keyboard_interrupt_is_one_line_with_status_130(monkeypatch, capsys):
    from keras_transformer.cli import translate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(translate, "run", interrupted)
    monkeypatch.delenv(errors.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "--model", "x", "a"])
    assert raised.value.code == 130
    assert capsys.readouterr().err == "keras-transformer translate: interrupted.\n"


@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_training_stopped_by_a_signal_is_one_line_with_its_status(monkeypatch, capsys, signal_name, status):
    """128 + the signal's number, as shells report it, and how to go on (the checkpoint is tested in test_loop)."""
    import signal

    from keras_transformer.cli import train
    from keras_transformer.training.callbacks import TrainingInterrupted

    def stopped(args):
        raise TrainingInterrupted(getattr(signal, signal_name), 5)

    monkeypatch.setattr(train, "run", stopped)
    monkeypatch.delenv(errors.DEBUG_ENVIRONMENT, raising=False)
    with pytest.raises(SystemExit) as raised:
        cli.main(["train", "--data", "multi30k", "--output", "run"])
    assert raised.value.code == status
    assert capsys.readouterr().err == (
        f"keras-transformer train: interrupted ({signal_name} at step 5); "
        "run the same command again to resume from its checkpoint.\n"
    )


def _syscall(pid):
    """The system call the process `pid` is blocked in, as /proc/PID/syscall gives it (None if unreadable)."""
    try:
        with open(f"/proc/{pid}/syscall") as f:
            return f.read().split()
    except OSError:
        return None


def test_ctrl_c_while_reading_stdin_is_one_line_with_status_130(tiny_run_dir):
    """SIGINT once the command waits for its input (seen in /proc, not guessed from a delay)."""
    if _syscall(os.getpid()) is None:
        pytest.skip("no /proc/PID/syscall")
    proc = subprocess.Popen(
        CLI + ["translate", "--model", tiny_run_dir],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=ENV,
        preexec_fn=default_sigint,
    )
    deadline = time.monotonic() + 300
    # Blocked in read(0, ...): x86-64's read is system call 0, aarch64's 63.
    while (call := _syscall(proc.pid)) is None or not (call[0] in ("0", "63") and call[1] == "0x0"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert out == b""
    assert b"Traceback" not in err and err.decode().splitlines()[-1] == "keras-transformer translate: interrupted."


def test_describe_tells_bad_input_from_failures():
    import tensorflow as tf

    assert errors.describe(FileNotFoundError(errno.ENOENT, "No such file or directory", "a.txt")) == (
        "a.txt: No such file or directory",
        2,
    )
    assert errors.describe(IsADirectoryError(errno.EISDIR, "Is a directory", "d"))[1] == 2
    assert errors.describe(OSError(errno.ENOSPC, "No space left on device", "ckpt.h5")) == (
        "ckpt.h5: No space left on device",
        1,
    )
    assert errors.describe(tf.errors.NotFoundError(None, None, "x.model; No such file or directory")) == (
        "x.model; No such file or directory",
        2,
    )
    assert errors.describe(tf.errors.InternalError(None, None, "bad\n\t[[{{node x}}]]")) == ("bad", 1)
    assert errors.describe(ValueError("beam too small")) == ("beam too small", 2)
    assert errors.describe(ZeroDivisionError("division by zero")) == ("ZeroDivisionError: division by zero", 1)
