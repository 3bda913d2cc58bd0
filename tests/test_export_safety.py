"""Safe by default: `export --overwrite` replaces only exports; `translate` refuses a SavedModel that touches files.

The SavedModels here are real ones: one exported by keras-transformer, and small ones whose serving
signature writes a file (directly, from a nested function of the graph's library, or through Python).
"""

import os

import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.inference.export_dirs import unsafe_ops
from keras_transformer.inference.saved_model import export_saved_model

SIGNATURE = [tf.TensorSpec([None], tf.string, name="inputs")]


def outputs(inputs):
    return {"translations": inputs, "scores": tf.zeros(tf.shape(inputs), tf.float32)}


def write_directly(target):
    class Model(tf.Module):
        @tf.function(input_signature=SIGNATURE)
        def serve(self, inputs):
            with tf.control_dependencies([tf.io.write_file(target, "written")]):
                return outputs(tf.identity(inputs))

    return Model()


def write_in_a_library_function(target):
    @tf.function(autograph=False)
    def nested(inputs):
        with tf.control_dependencies([tf.io.write_file(target, "written")]):
            return tf.identity(inputs)

    class Model(tf.Module):
        @tf.function(input_signature=SIGNATURE)
        def serve(self, inputs):
            return outputs(nested(inputs))

    return Model()


def write_from_python(target):
    def write(inputs):
        with open(target, "w") as f:
            f.write("written")
        return inputs

    class Model(tf.Module):
        @tf.function(input_signature=SIGNATURE)
        def serve(self, inputs):
            return outputs(tf.py_function(write, [inputs], tf.string))

    return Model()


@pytest.mark.parametrize(
    "make, op",
    [(write_directly, "WriteFile"), (write_in_a_library_function, "WriteFile"), (write_from_python, "EagerPyFunc")],
)
def test_translate_refuses_a_saved_model_that_touches_files(make, op, tmp_path, capsys):
    target = tmp_path / "written.txt"
    model = make(str(target))
    path = str(tmp_path / "model")
    tf.saved_model.save(model, path, signatures={"serving_default": model.serve})
    found = unsafe_ops(path)
    assert any(item.startswith(f"{op} (") for item in found), found
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "--model", path, "a dog"])
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"keras-transformer translate: --model {path}: its graph holds {op} (") and err.endswith(
        "refused; give --trust-model to run it anyway.\n"
    )
    assert not target.exists()
    if make is not write_from_python:  # the Python function does not survive the process that saved it
        assert cli.main(["translate", "--model", path, "--trust-model", "a dog"]) == 0
        assert capsys.readouterr().out == "a dog\n"
        assert target.read_text() == "written"


def test_a_keras_transformer_export_is_trusted(tiny_run_dir, tmp_path, capsys):
    path = export_saved_model(
        tiny_run_dir, str(tmp_path / "export"), beam_size=1, max_extra_length=2, dtype="float32", warmup_sentences=None
    )
    assert unsafe_ops(path) == []  # its saver's SaveV2, RestoreV2, MergeV2Checkpoints are left out
    assert cli.main(["translate", "--model", path, "A dog."]) == 0


def test_overwrite_replaces_only_an_export(tiny_run_dir, tmp_path, capsys):
    base = tmp_path / "exp"
    (base / "1").mkdir(parents=True)
    (base / "1" / "notes.txt").write_text("my notes")
    argv = ["export", "--model", tiny_run_dir, "--output", str(base), "--version", "1", "--overwrite", "--no-warmup"]
    with pytest.raises(SystemExit) as raised:
        cli.main(argv + ["--beam", "1"])
    assert raised.value.code == 2
    assert capsys.readouterr().err == (
        f"keras-transformer export: {base / '1'} exists and is not a keras-transformer export (no "
        "assets/export.json): overwrite replaces only exports; move it away or pick another version. "
        "(--version, --overwrite)\n"
    )
    assert (base / "1" / "notes.txt").read_text() == "my notes"
    assert sorted(os.listdir(base)) == ["1"]
    # An export is replaced.
    (base / "1" / "notes.txt").unlink()
    (base / "1").rmdir()
    assert cli.main(argv[:-2] + ["--beam", "1", "--no-warmup"]) == 0
    assert cli.main(argv + ["--beam", "2"]) == 0
    assert sorted(os.listdir(base)) == ["1"]
