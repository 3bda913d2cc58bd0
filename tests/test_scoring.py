"""Scoring pairs (forced decoding) through the translator and `keras-transformer score`."""

import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.data.corpora import read_lines
from keras_transformer.inference.scoring import score_pairs
from keras_transformer.inference.translator import Translator
from keras_transformer.special_ids import EOS_ID, PAD_ID

SOURCES = read_lines("val", "en")[:12]


def test_pair_scores_are_forced_decoding_of_the_tokenized_target(tiny_run_dir):
    """score_pairs(source, target) = log P(pieces of target + end | source): the same number as
    `decoding.score_outputs`, which equals beam search's score of its own outputs with alpha = 0
    (tests/test_sampling_and_scoring.py), so a translation scores what beam search reported for it."""
    from keras_transformer.decoding import score_outputs

    translator = Translator.from_run_dir(tiny_run_dir)
    targets = read_lines("val", "de")[:12]
    rows = [translator.tokenizer.encode(t) + [EOS_ID] for t in targets]
    width = max(len(r) for r in rows)
    output_ids = np.array([r + [PAD_ID] * (width - len(r)) for r in rows], np.int32)
    expected, _ = score_outputs(translator.model, translator.source_ids(np.array(SOURCES, object)), output_ids)
    scores = score_pairs(translator, SOURCES, targets, batch_size=5)  # batched by length, order restored
    np.testing.assert_allclose(scores, expected.numpy(), atol=1e-4)


def test_normalized_scores_are_per_token(tiny_run_dir):
    translator = Translator.from_run_dir(tiny_run_dir)
    targets = read_lines("val", "de")[:12]
    totals = score_pairs(translator, SOURCES, targets)
    per_token = score_pairs(translator, SOURCES, targets, normalize=True, batch_size=5)
    counts = [len(translator.tokenizer.encode(t)) + 1 for t in targets]  # the end token counts
    np.testing.assert_allclose(per_token, np.array(totals) / counts, rtol=1e-5)
    assert all(score < 0 for score in totals)
    with pytest.raises(ValueError, match="12 sources but 11 targets"):
        score_pairs(translator, SOURCES, targets[:11])
    for bad in (0, -3, 2.5):  # range(0, N, 0) used to raise its own ValueError; 2.5 a TypeError
        with pytest.raises(ValueError, match=f"batch_size must be at least 1, got {bad}"):
            score_pairs(translator, SOURCES, targets, batch_size=bad)


def test_score_command_prints_one_score_per_pair(tiny_run_dir, tmp_path, capsys):
    src, tgt = tmp_path / "src.en", tmp_path / "tgt.de"
    src.write_text("\n".join(SOURCES[:5]) + "\n", encoding="utf-8")
    targets = read_lines("val", "de")[:5]
    tgt.write_text("\n".join(targets) + "\n", encoding="utf-8")
    capsys.readouterr()
    assert cli.main(["score", "--model", tiny_run_dir, "--src", str(src), "--tgt", str(tgt), "--normalize"]) == 0
    printed = [float(line) for line in capsys.readouterr().out.splitlines()]
    expected = score_pairs(Translator.from_run_dir(tiny_run_dir), SOURCES[:5], targets, normalize=True)
    np.testing.assert_allclose(printed, expected, atol=1e-6)
    tgt.write_text("one line\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="5 lines but .* has 1"):
        cli.main(["score", "--model", tiny_run_dir, "--src", str(src), "--tgt", str(tgt)])
    tgt.write_text("\n".join(targets) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="score: --batch-size must be at least 1, got 0"):
        cli.main(["score", "--model", tiny_run_dir, "--src", str(src), "--tgt", str(tgt), "--batch-size", "0"])
