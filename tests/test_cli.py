"""The translate, evaluate and attention commands on a run directory."""

import io
import json
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

from keras_transformer import cli
from keras_transformer.data.corpora import newstest2014_path, read_newstest2014
from keras_transformer.inference.evaluation import corpus_scores


def run_cli(argv, capsys, stdin=None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert cli.main(argv) == 0
    return capsys.readouterr()


def test_translate_arguments_and_stdin(tiny_run_dir, capsys, monkeypatch):
    out = run_cli(["translate", "--model", tiny_run_dir, "--max-extra-length", "3",
                   "A dog runs.", "Two men talk."], capsys)
    assert len(out.out.splitlines()) == 2
    # One output line per input line; an empty input line gives an empty output line.
    out = run_cli(["translate", "--model", tiny_run_dir, "--max-extra-length", "3", "--quiet"],
                  capsys, stdin="A dog runs.\n\nTwo men talk.\n", monkeypatch=monkeypatch)
    lines = out.out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == ""


def test_translate_precision_and_early_stopping_options(tiny_run_dir, capsys):
    """--precision decodes under another dtype policy with the same weights; --early-stopping is accepted."""
    from keras_transformer.run_dir import load_run

    model, _ = load_run(tiny_run_dir, dtype="mixed_bfloat16")
    assert model.dtype_policy.name == "mixed_bfloat16" and model.compute_dtype == "bfloat16"
    reference, _ = load_run(tiny_run_dir, dtype="float32")
    for ours, theirs in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(ours, theirs)  # same float32 weights, other compute dtype
    sentences = ["A dog runs.", "Two men talk."]
    outputs = {}
    for options in ([], ["--precision", "float32"], ["--precision", "mixed_bfloat16"],
                    ["--early-stopping", "k_finished"]):
        out = run_cli(["translate", "--model", tiny_run_dir, "--max-extra-length", "3", *options, *sentences],
                      capsys)
        outputs[tuple(options)] = out.out.splitlines()
        assert len(outputs[tuple(options)]) == 2
    assert outputs[("--precision", "float32")] == outputs[()]  # the tiny run was saved in float32


def test_missing_model_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        cli.main(["translate", "--model", str(tmp_path / "nope"), "x"])


def test_evaluate_prints_json_with_signatures(tiny_run_dir, capsys, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("A dog runs.\nTwo men talk.\n", encoding="utf-8")
    ref.write_text("Ein Hund rennt.\nZwei Männer reden.\n", encoding="utf-8")
    out = run_cli(["evaluate", "--model", tiny_run_dir, "--src", str(src), "--ref", str(ref),
                   "--max-extra-length", "3"], capsys)
    result = json.loads(out.out)
    assert result["sentences"] == 2
    assert 0 <= result["bleu"] <= 100 and 0 <= result["chrf"] <= 100
    assert result["bleu_signature"].startswith("nrefs:1") and "chrf_signature" in result


def test_evaluate_refuses_misaligned_files(tiny_run_dir, tmp_path):
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("a\nb\n", encoding="utf-8")
    ref.write_text("a\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="has 2 lines but .* has 1"):
        cli.main(["evaluate", "--model", tiny_run_dir, "--src", str(src), "--ref", str(ref)])


def test_scores_of_reference_against_itself_and_of_the_source():
    references = read_newstest2014("de")
    assert corpus_scores(references, references)["bleu"] == pytest.approx(100.0)
    # The English source scored against the German reference: low, and the same every time.
    first = corpus_scores(read_newstest2014("en"), references)
    again = corpus_scores(read_newstest2014("en"), references)
    assert first["bleu"] == again["bleu"] and 0 < first["bleu"] < 10
    assert newstest2014_path("de").endswith(".gz")


def test_attention_command_draws_the_sentence_tokens(tiny_run_dir, capsys, tmp_path, monkeypatch):
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: figures.append(figure))
    output = tmp_path / "attention.png"
    sentence = "A dog runs on the beach."
    run_cli(["attention", "--model", tiny_run_dir, "--output", str(output), "--layer", "0",
             "--beam", "1", sentence], capsys)
    assert output.stat().st_size > 10_000
    assert output.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    (figure,) = figures
    encoder_axis = figure.axes[0]
    labels = [label.get_text() for label in encoder_axis.get_xticklabels()]
    from keras_transformer.inference.translator import Translator

    tokenizer = Translator.from_run_dir(tiny_run_dir).tokenizer
    assert labels == tokenizer.pieces(tokenizer.encode(sentence)) + ["</s>"]
    assert len(figure.axes) == 3 * 4  # encoder, decoder, cross x 4 heads
    close(figure)


def test_attention_refuses_a_bad_layer(tiny_run_dir):
    with pytest.raises(SystemExit, match="out of range"):
        cli.main(["attention", "--model", tiny_run_dir, "--layer", "7", "x"])
