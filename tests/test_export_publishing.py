"""How an export reaches its place and what it keeps: versions published whole, the Translator's own limits,
the weights it was made from, an export's n-best signature against a smaller beam."""

import json
import os
import re

import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.inference import saved_model
from keras_transformer.inference.saved_model import export_saved_model
from keras_transformer.inference.translator import SavedModelTranslator, Translator
from keras_transformer.run_dir import weights_file

EXTRA = 4  # short outputs: these tests are about files, not translations


def _info(export_dir):
    with tf.io.gfile.GFile(os.path.join(export_dir, "assets", "export.json")) as f:
        return json.load(f)


def _fail_after_saving(monkeypatch, effect):
    """Runs `effect(work_dir)` where the export checks its ops (after the SavedModel is written), then fails."""

    def check_then_fail(work_dir):
        effect(work_dir)
        raise RuntimeError("disk full")

    monkeypatch.setattr(saved_model, "check_serving_ops", check_then_fail)


def test_a_version_that_appears_during_the_export_is_not_replaced(tiny_run_dir, tmp_path, monkeypatch):
    """Two exports that pick the same next version: the later one fails instead of deleting the other's."""
    base = tmp_path / "models"
    real_check = saved_model.check_serving_ops

    def other_export_lands(work_dir):
        real_check(work_dir)
        (base / "1" / "assets").mkdir(parents=True)
        (base / "1" / "assets" / "export.json").write_text("{}")  # an export: --overwrite may replace it
        (base / "1" / "OTHER_EXPORT").write_text("kept")

    monkeypatch.setattr(saved_model, "check_serving_ops", other_export_lands)
    with pytest.raises(FileExistsError, match="written while this export ran"):
        export_saved_model(tiny_run_dir, str(base), max_extra_length=EXTRA, dtype="float32", warmup_sentences=None)
    assert sorted(os.listdir(base)) == ["1"] and sorted(os.listdir(base / "1")) == ["OTHER_EXPORT", "assets"]

    monkeypatch.setattr(saved_model, "check_serving_ops", real_check)
    path = export_saved_model(
        tiny_run_dir,
        str(base),
        version=1,
        overwrite=True,
        max_extra_length=EXTRA,
        dtype="float32",
        warmup_sentences=None,
    )
    assert sorted(os.listdir(base)) == ["1"] and "OTHER_EXPORT" not in os.listdir(path)  # replaced whole


def test_remote_exports_are_published_whole(tiny_run_dir, monkeypatch):
    """On a file system without directory renames (ram:// stands in for gs:// and s3://): a failed export
    leaves nothing a server would load; an overwrite leaves no file of the version it replaces."""
    base = "ram://keras_transformer_publish_test"
    # No warm-up requests: TF's ram:// file system lists "assets.extra" inside "assets" too (a bug of its own).
    options = dict(max_extra_length=EXTRA, dtype="float32", warmup_sentences=None)
    first = export_saved_model(tiny_run_dir, base, **options)
    assert [name.rstrip("/") for name in tf.io.gfile.listdir(base)] == ["1"]
    assert SavedModelTranslator(first).translate(["A dog."]) is not None  # loads and answers
    with tf.io.gfile.GFile(os.path.join(first, "assets", "left_from_before"), "w") as f:
        f.write("an older export's file")

    again = export_saved_model(tiny_run_dir, base, version=1, overwrite=True, **options)
    assert again == first and not tf.io.gfile.exists(os.path.join(first, "assets", "left_from_before"))
    assert len(SavedModelTranslator(again).translate(["A dog.", ""])) == 2

    _fail_after_saving(monkeypatch, lambda work_dir: None)
    with pytest.raises(RuntimeError, match="disk full"):
        export_saved_model(tiny_run_dir, base, **options)
    assert [name.rstrip("/") for name in tf.io.gfile.listdir(base)] == ["1"]  # no version 2, no temporary
    tf.io.gfile.rmtree(base)


def test_a_translator_s_own_limits_survive_other_decoding_options(tiny_run_dir, tmp_path):
    """Exporting a Translator with other options keeps its request limit (and records it); a sampling
    Translator is exported sampling, and export.json says so."""
    translator = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA, max_batch_size=32)
    path = export_saved_model(translator, str(tmp_path / "limited"), alpha=0.3, warmup_sentences=None)
    assert _info(path)["decoding"]["max_batch_size"] == 32 and _info(path)["decoding"]["alpha"] == 0.3
    signature = tf.saved_model.load(path).signatures["serving_default"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="at most 32 sentences"):
        signature(inputs=tf.constant(["A dog."] * 33))

    sampling = dict(temperature=1.0, top_k=5, seed=3)
    sampler = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA, sampling=sampling)
    path = export_saved_model(sampler, str(tmp_path / "sampling"), max_input_length=8, warmup_sentences=None)
    assert _info(path)["decoding"]["sampling"] == sampling


def test_export_json_names_the_weights_it_was_made_from(tiny_run_dir, tmp_path):
    path = export_saved_model(
        tiny_run_dir, str(tmp_path / "final"), max_extra_length=EXTRA, dtype="float32", warmup_sentences=None
    )
    assert _info(path)["weights"] == weights_file(tiny_run_dir) == os.path.join(tiny_run_dir, "model.keras")
    again = export_saved_model(path, str(tmp_path / "again"), warmup_sentences=None)
    assert _info(again)["weights"] == _info(path)["weights"]  # a re-export: the weights it carries


def test_an_export_s_n_best_signature_against_a_smaller_beam(tiny_run_dir, tmp_path, capsys):
    """A re-export keeps an export's N; a beam too small for it is refused with where N came from, and
    n_best 0 (--n-best 0) exports without the signature."""
    first = export_saved_model(
        tiny_run_dir,
        str(tmp_path / "nbest"),
        beam_size=3,
        max_extra_length=EXTRA,
        dtype="float32",
        n_best=3,
        warmup_sentences=None,
    )
    with pytest.raises(SystemExit) as raised:
        cli.main(["export", first, "--output", str(tmp_path / "smaller"), "--beam", "2", "--no-warmup"])
    assert raised.value.code == 2
    assert re.fullmatch(
        r"keras-transformer export: --n-best: must be given: .* translate_n_best signature of the 3 best, more "
        r"than the beam size 2 gives; give at most 2, or 0 for no n-best signature\.\n",
        capsys.readouterr().err,
    )
    assert not os.path.exists(tmp_path / "smaller" / "1")
    assert (
        cli.main(
            ["export", first, "--output", str(tmp_path / "smaller"), "--beam", "2", "--n-best", "0", "--no-warmup"]
        )
        == 0
    )
    path = str(tmp_path / "smaller" / "1")
    assert "n_best_signature" not in _info(path) and _info(path)["decoding"]["beam_size"] == 2
    assert set(tf.saved_model.load(path).signatures) == {
        "serving_default",
        "translate_with_prefix",
        "translate_with_alignments",
    }
    kept = export_saved_model(first, str(tmp_path / "kept"), warmup_sentences=None)
    assert _info(kept)["n_best_signature"]["n_best"] == 3
    with pytest.raises(ValueError, match="n_best must be between 1 and the beam size 3"):
        export_saved_model(first, str(tmp_path / "bad"), n_best=-1, warmup_sentences=None)
