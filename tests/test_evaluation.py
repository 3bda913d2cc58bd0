"""The lower-cased tokenized BLEU of Multi30k papers, computed exactly as their references were made."""

import gzip
import os

import pytest

from keras_transformer.data import corpora
from keras_transformer.inference.evaluation import corpus_scores, moses_tokenize_lowercase

OFFICIAL = os.path.join(os.path.dirname(corpora.__file__), "multi30k", "test2016.lc.norm.tok.de.gz")


def official_tokenized_references():
    with gzip.open(OFFICIAL, "rt", encoding="utf-8") as f:
        return f.read().split("\n")[:-1]


def test_pipeline_reproduces_the_official_tokenized_test2016_references():
    """lowercase + normalize-punctuation.perl -l de + tokenizer.perl -l de, line for line (all 1,000)."""
    official = official_tokenized_references()
    ours = moses_tokenize_lowercase(corpora.read_lines("test2016", "de"), "de")
    assert len(official) == len(ours) == 1000
    mismatches = [i for i, (a, b) in enumerate(zip(ours, official)) if a != b]
    assert not mismatches, (mismatches[:5], ours[mismatches[0]], official[mismatches[0]])
    assert sum(len(line.split()) for line in official) == 12103  # the reference length fairseq reports


def test_escaping_and_punctuation_normalization_are_applied():
    # Escaping (&quot; &apos; &amp;) and normalized quotes are what tell this pipeline from a plain one.
    assert moses_tokenize_lowercase(['Ein "Hund" & eine Katze\'s Ball.'], "de") == [
        "ein &quot; hund &quot; &amp; eine katze &apos; s ball ."
    ]


def test_tokenized_bleu_of_the_references_against_the_official_file_is_100():
    references = corpora.read_lines("test2016", "de")
    scores = corpus_scores(references, references, lang="de")
    assert scores["tok_bleu"] == pytest.approx(100.0)
    assert "moses-norm" in scores["tok_bleu_signature"]
