"""A quiet start: no TensorFlow start-up logging unless asked for; `--version` and a bare command.

Each command runs as the console script runs it, in a process of its own, with an environment
that sets none of TensorFlow's logging variables.
"""

import os
import subprocess
import sys
import time

import pytest

CLI = [sys.executable, "-m", "keras_transformer.cli"]
# Lines TensorFlow's C++ libraries print as they load and look for GPUs.
TF_START_UP = ("absl::InitializeLog", "oneDNN", "cuda", "cuInit", "cpu_feature_guard", "To enable the following")
QUIET_ENV = {
    k: v
    for k, v in os.environ.items()
    if k
    not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "KERAS_TRANSFORMER_TF_LOGS", "KERAS_TRANSFORMER_DEBUG")
}


def run_command(argv, env=QUIET_ENV):
    return subprocess.run(CLI + argv, capture_output=True, text=True, env=env, timeout=300)


def start_up_lines(stderr):
    return [line for line in stderr.splitlines() if any(marker in line for marker in TF_START_UP)]


def test_tensorflow_start_up_logging_is_silenced_by_default(tmp_path):
    """A command that loads TensorFlow and fails on its input: its one error line, nothing else."""
    proc = run_command(["translate", "--model", str(tmp_path), "a"])
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"keras-transformer translate: --model {tmp_path}: {tmp_path}/spm.model; No such file or directory"
    ]


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_tensorflow_start_up_logging_comes_back_when_asked(tmp_path, how):
    argv = ["translate", "--model", str(tmp_path), "a"]
    if how == "flag":
        proc = run_command(["--verbose-tf", *argv])
    else:
        proc = run_command(argv, env=dict(QUIET_ENV, KERAS_TRANSFORMER_TF_LOGS="1"))
    assert proc.returncode == 2
    assert start_up_lines(proc.stderr), proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("keras-transformer translate: --model")


def test_every_command_help_says_how_to_get_the_logs_back():
    from keras_transformer import cli

    parser = cli.build_parser()
    commands = parser._subparsers._group_actions[0].choices
    for name, command in commands.items():
        assert "--verbose-tf" in command.format_help() and "KERAS_TRANSFORMER_TF_LOGS=1" in command.format_help(), name
    assert "--verbose-tf" in parser.format_help()


COMMAND_NAMES = ("train", "translate", "evaluate", "score", "attention", "export", "average-checkpoints")


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["--help"], []] + [[command, "--help"] for command in COMMAND_NAMES],
    ids=["version", "help", "bare"] + [f"{command}-help" for command in COMMAND_NAMES],
)
def test_version_and_the_help_are_fast_and_load_no_tensorflow(argv):
    code = (
        "import sys\n"
        "from keras_transformer import cli\n"
        "try:\n"
        f"    cli.main({argv!r})\n"
        "finally:\n"
        "    print('tensorflow' in sys.modules, 'keras' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=QUIET_ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\nFalse False\n")
    start = time.monotonic()
    proc = run_command(argv)
    elapsed = time.monotonic() - start
    assert (proc.returncode, proc.stderr) == (0, "")
    if argv == ["--version"]:
        assert proc.stdout == "keras-transformer 0.3.0\n"
    assert elapsed < 5  # only catches a hang: that TensorFlow is not loaded is the check


def test_the_commands_help_is_the_full_parsers():
    """`--help` answers from `cli.commands`; the full parser (a command's --help) shows the same lines."""
    from keras_transformer import cli

    assert cli.build_parser(commands_only=True).format_help() == cli.build_parser().format_help()


def test_a_bare_command_prints_the_help():
    proc = run_command([])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: keras-transformer")
    for command in ("train", "translate", "evaluate", "attention", "export", "average-checkpoints", "score"):
        assert f"    {command}" in proc.stdout
    assert proc.stderr == ""


def test_a_transformer_file_loads_after_only_import_keras_transformer(tiny_run_dir):
    """The package loads its model lazily; Keras still finds the classes a `.keras` file names."""
    path = os.path.join(tiny_run_dir, "model.keras")
    for first in ("import keras_transformer\nimport keras\n", "import keras\nimport keras_transformer\n"):
        code = (
            first + f"model = keras.saving.load_model({path!r})\nprint(type(model).__module__, type(model).__name__)\n"
        )
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.splitlines()[-1] == "keras_transformer.model Transformer"


def test_loading_a_model_prints_no_native_logs_but_python_warnings(tiny_run_dir, tmp_path):
    """SentencePiece logs from C++ as it reads a vocabulary; Python's warnings still show meanwhile."""
    from keras_transformer.inference.saved_model import export_saved_model

    proc = run_command(["translate", "--model", tiny_run_dir, "--max-extra-length", "2", "A dog."])
    assert (proc.returncode, proc.stderr) == (0, "")
    proc = run_command(["--verbose-tf", "translate", "--model", tiny_run_dir, "--max-extra-length", "2", "A dog."])
    assert proc.returncode == 0 and "normalizer.cc" in proc.stderr
    path = export_saved_model(
        tiny_run_dir, str(tmp_path / "export"), beam_size=1, max_extra_length=2, dtype="float32", warmup_sentences=None
    )
    proc = run_command(["translate", "--model", path, "--beam", "2", "A dog."])
    assert proc.returncode == 0
    assert proc.stderr == f"{path} is a SavedModel: decoding options were fixed at export; ignoring the ones given.\n"


def test_train_prints_nothing_on_stderr(spm500, tmp_path):
    """A short run of the tiny preset (its vocabulary given): progress on stdout, and no native logs on stderr."""
    import shutil

    (tmp_path / "run").mkdir()
    shutil.copy(spm500, tmp_path / "run" / "spm.model")
    argv = ["train", "--preset", "tiny", "--max-steps", "1", "--validation-split", "none", "--vocab-size", "500"]
    proc = run_command([*argv, "--output", str(tmp_path / "run")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "Training tiny model" in proc.stdout
