"""`length_penalty="average"` (fairseq's and CTranslate2's normalization) from the library to the exports.

The search itself is tested in test_search.py; here the option travels: `Translator`, `load_translator`,
the SavedModel export (recorded in `export.json`, kept by a re-export), the LiteRT file and the command
line give the library search's translations and scores, on conftest.py's `end_token_run_dir`, where the
two penalties choose different translations.
"""

import json

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import decoding
from keras_transformer.data.corpora import read_lines
from keras_transformer.errors import ParameterError
from keras_transformer.inference.loading import load_translator
from keras_transformer.inference.translator import SavedModelTranslator, Translator

SENTENCES = read_lines("val", "en")[:6]
OPTIONS = dict(alpha=1.0, max_extra_length=10)


def _export_info(path):
    with open(f"{path}/assets/export.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def expected(end_token_run_dir):
    """`(translations, scores)` of SENTENCES by `Translator` with each penalty."""
    return {
        penalty: Translator.from_run_dir(end_token_run_dir, length_penalty=penalty, **OPTIONS).translate(
            SENTENCES, return_scores=True
        )
        for penalty in decoding.LENGTH_PENALTIES
    }


def test_the_penalties_translate_differently(expected):
    assert expected["gnmt"][0] != expected["average"][0]


def test_translator_searches_as_beam_search_does(end_token_run_dir, expected):
    translator = Translator.from_run_dir(end_token_run_dir, length_penalty="average", **OPTIONS)
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    ids, scores = decoding.beam_search(translator.model, source_ids, length_penalty="average", **OPTIONS)
    texts = [t.decode("utf-8") for t in translator.tokenizer.detokenize(ids).numpy()]
    assert texts == expected["average"][0]
    np.testing.assert_allclose(scores.numpy(), expected["average"][1], rtol=1e-5)


def test_greedy_scores_are_divided_by_the_length(end_token_run_dir):
    """Beam 1: the translator divides greedy search's log P by |Y| ** alpha, as beam search would."""
    translator = Translator.from_run_dir(end_token_run_dir, beam_size=1, length_penalty="average", **OPTIONS)
    source_ids = translator.source_ids(tf.constant(SENTENCES))
    ids, log_probs = decoding.greedy_search(translator.model, source_ids, max_extra_length=10)
    lengths = np.sum(ids.numpy() != 0, axis=1)
    _, scores = translator.translate(SENTENCES, return_scores=True)
    np.testing.assert_allclose(scores, log_probs.numpy() / lengths.astype("float32"), rtol=1e-5)


def test_export_records_fixes_and_keeps_it(end_token_run_dir, expected, tmp_path):
    from keras_transformer.inference.saved_model import export_saved_model

    base = str(tmp_path / "served")
    path = export_saved_model(
        end_token_run_dir, base, length_penalty="average", warmup_sentences=None, dtype="float32", **OPTIONS
    )
    info = _export_info(path)["decoding"]
    assert info["length_penalty"] == "average"
    assert info["score"] == "log P(Y|X) / |Y| ** alpha, |Y| counting the end token"
    translations, scores = SavedModelTranslator(path).translate(SENTENCES, return_scores=True)
    assert translations == expected["average"][0]
    np.testing.assert_allclose(scores, expected["average"][1], rtol=1e-5)
    again = export_saved_model(path, base, warmup_sentences=None)  # re-exported: kept unless given
    assert _export_info(again)["decoding"]["length_penalty"] == "average"
    assert SavedModelTranslator(again).translate(SENTENCES) == expected["average"][0]
    gnmt = export_saved_model(again, base, length_penalty="gnmt", warmup_sentences=None)
    assert "length_penalty" not in _export_info(gnmt)["decoding"]  # GNMT's, as an export before the option
    assert SavedModelTranslator(gnmt).translate(SENTENCES) == expected["gnmt"][0]


def test_litert_file_fixes_it(end_token_run_dir, expected, tmp_path):
    from keras_transformer.inference.export_sources import DecodingOptions
    from keras_transformer.inference.litert import LiteRTTranslator, export_litert, info_path

    path = export_litert(
        end_token_run_dir, str(tmp_path / "average.tflite"), DecodingOptions(length_penalty="average", **OPTIONS)
    )
    with open(info_path(path), encoding="utf-8") as f:
        assert json.load(f)["decoding"]["length_penalty"] == "average"
    translations, scores = LiteRTTranslator(path).translate(SENTENCES, return_scores=True)
    assert translations == expected["average"][0]
    np.testing.assert_allclose(scores, expected["average"][1], rtol=1e-4)


def test_command_line_and_load_translator(end_token_run_dir, expected, capsys):
    from keras_transformer import cli

    assert (
        load_translator(end_token_run_dir, length_penalty="average", **OPTIONS).translate(SENTENCES)
        == (expected["average"][0])
    )
    flags = ["--alpha", "1", "--max-extra-length", "10", "--length-penalty", "average", "--no-progress"]
    capsys.readouterr()
    assert cli.main(["translate", "--model", end_token_run_dir, *flags, *SENTENCES]) == 0
    assert capsys.readouterr().out.splitlines() == expected["average"][0]


def test_a_bad_value_is_refused_by_name(end_token_run_dir, capsys):
    from keras_transformer import cli

    with pytest.raises(ParameterError, match="length_penalty must be one of gnmt, average, got 'fairseq'"):
        Translator.from_run_dir(end_token_run_dir, length_penalty="fairseq")
    with pytest.raises(SystemExit) as raised:
        cli.main(["translate", "--model", end_token_run_dir, "--length-penalty", "fairseq", "A dog."])
    assert raised.value.code == 2
    assert "argument --length-penalty: invalid choice: 'fairseq'" in capsys.readouterr().err
