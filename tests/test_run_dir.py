"""Tests for keras_transformer.run_dir: the files of a run directory."""

import pytest

from keras_transformer.data import corpora
from keras_transformer.run_dir import get_or_train_tokenizer


def _train_texts():
    return corpora.read_lines("train", "en")[:2500] + corpora.read_lines("train", "de")[:2500]


def test_get_or_train_tokenizer_caches(tmp_path):
    run_dir = tmp_path / "run"
    calls = []

    def texts_fn():
        calls.append(1)
        return _train_texts()[:1000]

    first = get_or_train_tokenizer(run_dir, texts_fn, vocab_size=500)
    assert (run_dir / "spm.model").exists() and calls == [1]
    assert sorted(p.name for p in run_dir.iterdir()) == ["spm.model", "spm.vocab"]  # no temp left
    second = get_or_train_tokenizer(run_dir, lambda: pytest.fail("must not retrain"), vocab_size=500)
    assert second.model_proto == first.model_proto
    with pytest.raises(ValueError, match="vocab_size 500"):
        get_or_train_tokenizer(run_dir, texts_fn, vocab_size=600)
