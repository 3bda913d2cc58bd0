"""Re-exporting an exported version with the current code: same model, same options, same answers."""

import contextlib
import io
import json
import os
import shutil

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.inference.export_dirs import is_export_dir
from keras_transformer.inference.export_sources import DecodingOptions, load_export
from keras_transformer.inference.saved_model import export_run, reexport
from keras_transformer.inference.translator import SavedModelTranslator
from keras_transformer.run_dir import load_run

SENTENCES = [
    "A man in an orange hat starring at something.",
    "Two dogs run on the beach.",
    "",
    "People are fixing the roof of a house.",
]
OPTIONS = dict(beam_size=3, alpha=0.8, max_extra_length=7, early_stopping="k_finished")
METADATA = {"test2016": {"tok_bleu": 12.5}, "command": "make demo"}


def _info(export_dir):
    with open(os.path.join(export_dir, "assets", "export.json")) as f:
        return json.load(f)


TRAINING = {"preset": "tiny", "batch_tokens": 512}


@pytest.fixture(scope="module")
def first_export(tiny_run_dir, tmp_path_factory):
    """A float32 export with other decoding options than §6.1's, metadata, and the run's training options."""
    run = tmp_path_factory.mktemp("trained") / "run"
    shutil.copytree(tiny_run_dir, run)
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "training": TRAINING}))
    base = tmp_path_factory.mktemp("saved_models") / "tiny"
    # mixed_bfloat16: a precision "auto" never picks, so keeping it is the re-export's doing.
    return export_run(
        str(run), str(base), DecodingOptions(**OPTIONS), dtype="mixed_bfloat16", metadata=METADATA, n_best=2
    )


def test_load_export_gives_the_run_model(tiny_run_dir, first_export):
    assert is_export_dir(first_export) and not is_export_dir(tiny_run_dir)
    model, tokenizer, info = load_export(first_export)
    trained, trained_tokenizer = load_run(tiny_run_dir)
    assert model.dtype_policy.name == info["precision"] == "mixed_bfloat16"
    assert model.config == trained.config
    assert len(model.weights) == len(trained.weights)
    for mine, theirs in zip(model.weights, trained.weights):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=mine.path)
    assert tokenizer.model_proto == trained_tokenizer.model_proto


def test_reexport_keeps_options_metadata_and_answers(first_export, tmp_path):
    again = reexport(first_export, str(tmp_path / "again"))
    before, after = _info(first_export), _info(again)
    assert after["decoding"] == before["decoding"]
    assert {k: after["decoding"][k] for k in OPTIONS} == OPTIONS
    assert after["precision"] == "mixed_bfloat16" and after["precision_choice"] == before["precision_choice"]
    assert after["metadata"] == METADATA and after["training"] == before["training"] == TRAINING
    assert after["reexported_from"]["exported_at"] == before["exported_at"]
    assert after["n_best_signature"] == before["n_best_signature"]  # the signature is not dropped
    translations = [
        SavedModelTranslator(path).translate(SENTENCES, return_scores=True) for path in (first_export, again)
    ]
    assert translations[0][0] == translations[1][0]
    np.testing.assert_allclose(translations[0][1], translations[1][1], rtol=1e-5, atol=1e-5)


def test_reexport_options_can_change(first_export, tmp_path):
    again = reexport(first_export, str(tmp_path / "other"), DecodingOptions(beam_size=2), metadata={"note": "new"})
    info = _info(again)
    assert info["decoding"]["beam_size"] == 2 and info["decoding"]["alpha"] == OPTIONS["alpha"]
    assert info["metadata"] == {"note": "new"}
    # Other options without new metadata: the old scores no longer describe this export.
    info = _info(reexport(first_export, str(tmp_path / "float32"), dtype="float32"))
    assert info["precision"] == "float32" and info["precision_choice"] is None
    assert "metadata" not in info
    assert info["reexported_from"]["metadata"] == METADATA
    assert info["reexported_from"]["precision"] == "mixed_bfloat16"
    # A second re-export keeps the chain back to the run.
    twice = _info(reexport(os.path.join(str(tmp_path / "float32"), "1"), str(tmp_path / "twice")))
    assert twice["reexported_from"]["reexported_from"]["source"] == _info(first_export)["source"]


def test_mismatched_variables_are_refused(first_export, tmp_path):
    broken = str(tmp_path / "1")
    shutil.copytree(first_export, broken)
    info = _info(broken)
    info["model"]["d_ff"] *= 2
    with open(os.path.join(broken, "assets", "export.json"), "w") as f:
        json.dump(info, f)
    with pytest.raises(ValueError, match=r"variables are not those of the model .* variable \d+ is .*inner"):
        load_export(broken)
    with pytest.raises(SystemExit, match="variables are not those of the model"):
        cli.main(["export", broken, "--output", str(tmp_path / "out")])
    info["model"]["d_ff"] //= 2
    info["model"]["num_layers"] += 1
    with open(os.path.join(broken, "assets", "export.json"), "w") as f:
        json.dump(info, f)
    with pytest.raises(ValueError, match=r"the model has \d+ variables, the export \d+"):
        load_export(broken)


def test_sources_that_are_not_one_export_get_a_clear_error(first_export, tmp_path):
    base = os.path.dirname(first_export)
    with pytest.raises(SystemExit, match="holds exported versions; give one"):
        cli.main(["export", base, "--output", str(tmp_path / "out")])
    foreign = str(tmp_path / "foreign")
    shutil.copytree(first_export, foreign)
    os.remove(os.path.join(foreign, "assets", "export.json"))
    with pytest.raises(SystemExit, match="a SavedModel without assets/export.json"):
        cli.main(["export", foreign, "--output", str(tmp_path / "out")])


def test_cli_reexports_a_version_in_place(first_export, tmp_path):
    base = str(tmp_path / "base")
    shutil.copytree(first_export, os.path.join(base, "1"))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert cli.main(["export", os.path.join(base, "1"), "--output", base, "--version", "1", "--overwrite"]) == 0
    assert stdout.getvalue().strip().splitlines()[-1] == os.path.join(base, "1")
    assert os.listdir(base) == ["1"]  # replaced, nothing left beside it
    info = _info(os.path.join(base, "1"))
    assert {k: info["decoding"][k] for k in OPTIONS} == OPTIONS  # not the CLI's §6.1 defaults
    assert info["precision"] == "mixed_bfloat16" and info["metadata"] == METADATA
    before, after = (
        SavedModelTranslator(path).translate(SENTENCES) for path in (first_export, os.path.join(base, "1"))
    )
    assert before == after
    with pytest.raises(SystemExit, match="checkpoint applies to a run directory"):
        cli.main(["export", os.path.join(base, "1"), "--output", base, "--checkpoint", "latest"])


def test_recorded_n_best_reads_the_field_or_an_older_exports_output_shape():
    from keras_transformer.inference.export_dirs import recorded_n_best as _recorded_n_best

    outputs = {"translations": "tf.string [None, 3]", "scores": "float32 [None, 3]"}
    assert _recorded_n_best({"n_best_signature": {"n_best": 3, "outputs": outputs}}) == 3
    assert _recorded_n_best({"n_best_signature": {"outputs": outputs}}) == 3  # written before the field existed
    assert _recorded_n_best({}) is None
