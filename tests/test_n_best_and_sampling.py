"""N-best lists and sampling through the Translator, the command line and the SavedModel."""

import re

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.inference.saved_model import export_saved_model
from keras_transformer.inference.translator import SavedModelTranslator, Translator

SOURCES = read_lines("val", "en")[:6] + [""]


@pytest.fixture(scope="module")
def translator(tiny_run_dir):
    return Translator.from_run_dir(tiny_run_dir, beam_size=4, max_extra_length=6)


def test_n_best_lists_are_sorted_and_start_with_the_translation(translator):
    best, best_scores = translator.translate(SOURCES, return_scores=True)
    lists = translator.translate(SOURCES, n_best=3, batch_size=4)
    assert [len(entries) for entries in lists] == [3] * len(SOURCES)
    for entries, text, score in zip(lists, best, best_scores):
        scores = [s for _, s in entries]
        assert scores == sorted(scores, reverse=True)
        assert entries[0][0] == text and entries[0][1] == pytest.approx(score, abs=1e-5)
    assert lists[-1] == [("", 0.0)] * 3  # a blank input
    # The hypotheses of a sentence are different translations.
    assert all(len({t for t, _ in entries}) > 1 for entries in lists[:-1])
    with pytest.raises(ValueError, match="between 1 and the beam size 4"):
        translator.translate(SOURCES, n_best=5)


def test_n_best_scores_at_beam_1_are_the_translation_scores(tiny_run_dir):
    # Beam search's scores are already log P / lp(|Y|) at beam 1: not divided by lp a second time.
    greedy = Translator.from_run_dir(tiny_run_dir, beam_size=1, alpha=1.0, max_extra_length=6)
    best, best_scores = greedy.translate(SOURCES, return_scores=True)
    lists = greedy.translate(SOURCES, n_best=1)
    assert [entries[0][0] for entries in lists] == best
    np.testing.assert_allclose([entries[0][1] for entries in lists], best_scores, rtol=1e-5, atol=1e-6)


def test_translate_command_writes_n_best_lines(tiny_run_dir, translator, capsys):
    capsys.readouterr()
    assert (
        cli.main(["translate", "--model", tiny_run_dir, "--max-extra-length", "6", "--n-best", "2", *SOURCES[:3]]) == 0
    )
    lines = capsys.readouterr().out.splitlines()
    expected = translator.translate(SOURCES[:3], n_best=2)
    assert len(lines) == 6
    for line, (index, (text, score)) in zip(lines, [(i, e) for i, entries in enumerate(expected) for e in entries]):
        got_index, got_score, got_text = line.split("\t")
        assert (int(got_index), got_text) == (index, text) and float(got_score) == pytest.approx(score, abs=1e-5)


def test_saved_model_n_best_signature(tiny_run_dir, translator, tmp_path):
    path = export_saved_model(tiny_run_dir, str(tmp_path / "served"), max_extra_length=6, n_best=2, dtype="float32")
    loaded = tf.saved_model.load(path)
    assert set(loaded.signatures) == {
        "serving_default",
        "translate_with_prefix",
        "translate_with_alignments",
        "translate_n_best",
    }
    outputs = loaded.signatures["translate_n_best"](inputs=tf.constant(SOURCES))
    assert outputs["translations"].shape == (len(SOURCES), 2) and outputs["scores"].shape == (len(SOURCES), 2)
    expected = translator.translate(SOURCES, n_best=2)
    texts = [[t.decode("utf-8") for t in row] for row in outputs["translations"].numpy()]
    assert texts == [[t for t, _ in entries] for entries in expected]
    np.testing.assert_allclose(outputs["scores"].numpy(), [[s for _, s in e] for e in expected], atol=1e-5)
    served = SavedModelTranslator(str(tmp_path / "served"))
    assert served.translate(SOURCES, n_best=1) == [entries[:1] for entries in translator.translate(SOURCES, n_best=1)]
    with pytest.raises(ValueError, match="exported with"):
        served.translate(SOURCES, n_best=3)
    # Without n_best, the export has no n-best signature.
    plain = tf.saved_model.load(
        export_saved_model(tiny_run_dir, str(tmp_path / "plain"), max_extra_length=6, dtype="float32")
    )
    assert set(plain.signatures) == {"serving_default", "translate_with_prefix", "translate_with_alignments"}


def test_sampling_from_the_command_line(tiny_run_dir, capsys):
    def run(*flags):
        capsys.readouterr()
        assert cli.main(["translate", "--model", tiny_run_dir, "--max-extra-length", "6", *flags, *SOURCES[:4]]) == 0
        return capsys.readouterr().out

    first = run("--sampling-temperature", "3", "--seed", "11")
    assert run("--sampling-temperature", "3", "--seed", "11") == first
    assert run("--sampling-temperature", "3", "--seed", "12") != first
    # Top-1 sampling is greedy search.
    assert run("--sampling-topk", "1", "--seed", "3") == run("--beam", "1")


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--sampling-temperature", "0"],
            "translate: temperature must be finite and at least 1.2e-38 (float32's tiny), got 0.0",
        ),
        (["--sampling-topk", "-1"], "translate: top_k must be a non-negative integer, got -1"),
    ],
)
def test_bad_sampling_flags_are_refused(tiny_run_dir, flags, message):
    # 0 is a temperature given, not a flag left out: refused, not replaced by the default 1.
    with pytest.raises(SystemExit, match=re.escape(message)):
        cli.main(["translate", "--model", tiny_run_dir, *flags, "A dog runs."])
