"""Scoring pairs (forced decoding) through the translator and `keras-transformer score`."""

import numpy as np
import pytest
import tensorflow as tf

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


@pytest.fixture(scope="module")
def learned_run_dir(tiny_run_dir, tmp_path_factory):
    """tiny_run_dir's vocabulary with a model of learned positions: a table of 16 rows."""
    import json
    import shutil

    from keras_transformer import Transformer, TransformerConfig

    path = tmp_path_factory.mktemp("learned") / "run"
    shutil.copytree(tiny_run_dir, path)
    config = TransformerConfig.tiny(400, max_length=16, positional_encoding="learned")
    model = Transformer(config)
    model.compile()
    (path / "model.keras").unlink()
    model.save(path / "model.keras")
    run_config = json.loads((path / "config.json").read_text())
    run_config["model"] = config.to_dict()
    (path / "config.json").write_text(json.dumps(run_config, indent=2))
    return str(path)


def test_targets_longer_than_learned_positions_are_a_clear_error(learned_run_dir, tmp_path):
    """A target of more than max_length - 1 pieces (the decoder sees the start token, then them) was a
    GatherV2 InvalidArgumentError from inside the graph; it is a ValueError naming the pair, and the
    score command's one-line error names the line. Sources are truncated, so a long one is fine."""
    from keras_transformer.inference.scoring import TargetTooLongError

    translator = Translator.from_run_dir(learned_run_dir)
    assert translator.model.config.positional_encoding == "learned"
    tokenizer = translator.tokenizer
    long = " ".join(read_lines("val", "de")[:6])
    assert len(tokenizer.encode(long)) > 15
    fits = tokenizer.detokenize([tokenizer.encode(long)[:15]]).numpy()[0].decode()  # the limit: max_length - 1
    assert len(tokenizer.encode(fits)) == 15
    targets = ["Ein Hund.", fits, "Zwei Männer.", long, long]
    sources = [SOURCES[0], long, SOURCES[1], SOURCES[2], SOURCES[3]]  # the long source is truncated
    with pytest.raises(TargetTooLongError, match=r"target of pair 3 \(0-based\) has \d+ pieces, more than the 15"):
        score_pairs(translator, sources, targets, batch_size=2)
    scores = score_pairs(translator, sources[:3], targets[:3])
    assert len(scores) == 3 and np.all(np.isfinite(scores))
    src, tgt = tmp_path / "src.en", tmp_path / "tgt.de"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    tgt.write_text("\n".join(targets) + "\n", encoding="utf-8")
    with pytest.raises(
        SystemExit,
        match=rf"^score: {tgt} line 4: the target has \d+ pieces, more than the 15 "
        "the model's learned positions allow.$",
    ):
        cli.main(["score", "--model", learned_run_dir, "--src", str(src), "--tgt", str(tgt)])


def test_targets_are_normalized_as_sources_are(tiny_run_dir):
    """A target goes through `Translator.normalized`, as its source does: tabs and runs of spaces inside,
    a leading byte-order mark, Unicode whitespace at the ends and invalid UTF-8 leave its score as the clean
    line's (tab and BOM moved one from -1.25 to -30.6 and -62.5)."""
    translator = Translator.from_run_dir(tiny_run_dir)
    clean = "Ein Hund läuft am Strand."
    messy = [
        "Ein Hund\tläuft am Strand.",
        "\ufeffEin Hund läuft am Strand.",
        "Ein  Hund läuft \t am Strand.",
        "\u3000Ein Hund läuft am Strand.\u00a0",
        " Ein Hund läuft am Strand.\r",
    ]
    sources = [SOURCES[0]] * (len(messy) + 1)
    scores = score_pairs(translator, sources, [clean] + messy)
    np.testing.assert_allclose(scores[1:], [scores[0]] * len(messy), atol=1e-5)
    # Invalid UTF-8 bytes are U+FFFD on both sides.
    replaced = score_pairs(translator, [SOURCES[0]], ["Ein Hund \ufffd."])
    from keras_transformer.inference.scoring import PairScorer

    scorer = PairScorer(translator)  # held: its tf.functions keep only a weak reference to it
    raw = scorer.score_strings(tf.constant([SOURCES[0]]), tf.constant([b"Ein Hund \xff."]))[0]
    np.testing.assert_allclose(raw.numpy(), replaced, atol=1e-5)
