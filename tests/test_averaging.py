"""Checkpoint averaging across runs (§6.1): only checkpoints of the same model and vocabulary.

The averaging itself (one run): tests/test_loop.py.
"""

import dataclasses
import json
import re
import shutil

import numpy as np
import pytest

from keras_transformer import TransformerConfig, training
from keras_transformer.data import corpora
from keras_transformer.run_dir import build_model

VOCAB = 400
CONFIG = TransformerConfig.tiny(vocab_size=VOCAB, num_layers=1)


@pytest.fixture(scope="module")
def vocabularies(tmp_path_factory):
    """Three spm.model files: one vocabulary trained twice (other bytes), and another vocabulary."""
    from keras_transformer.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("vocabularies")
    texts = corpora.read_lines("train", "en")[:1000] + corpora.read_lines("train", "de")[:1000]
    for name, lines in (("first", texts), ("again", texts), ("other", texts[500:])):
        train_tokenizer(lines, root / name / "spm", vocab_size=VOCAB)
    return {name: root / name / "spm.model" for name in ("first", "again", "other")}


def make_run(run_dir, vocabulary, config=CONFIG, checkpoint=None, seed=0):
    """A run directory with config.json, spm.model and one checkpoint: `checkpoint` copied, or random weights."""
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"model": config.to_dict()}))
    shutil.copy(vocabulary, run_dir / "spm.model")
    path = run_dir / "checkpoints" / "ckpt-00000010.weights.h5"
    if checkpoint:
        shutil.copy(checkpoint, path)
    else:
        model = build_model(config, dtype="float32")
        rng = np.random.default_rng(seed)
        model.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])
        model.save_weights(str(path))
    return str(path)


def test_runs_of_the_same_model_and_vocabulary_are_averaged(vocabularies, tmp_path):
    # The vocabulary trained again (other bytes), and another dropout (as a fine-tuning run may have).
    paths = [
        make_run(tmp_path / "a", vocabularies["first"], seed=1),
        make_run(tmp_path / "b", vocabularies["again"], seed=2),
        make_run(tmp_path / "c", vocabularies["first"], dataclasses.replace(CONFIG, dropout=0.3), seed=3),
    ]
    model = build_model(CONFIG, dtype="float32")
    drawn = []
    for path in paths:
        model.load_weights(path)
        drawn.append(model.get_weights())
    for got, *parts in zip(training.average_checkpoints(paths), *drawn):
        np.testing.assert_allclose(got, np.mean(parts, axis=0), rtol=1e-6, atol=1e-6)


def test_checkpoints_of_another_model_or_vocabulary_are_refused(vocabularies, tmp_path):
    """Same shapes: Keras loads them without a word, and the mean would be nonsense."""
    q = re.escape
    first = make_run(tmp_path / "first", vocabularies["first"])
    gelu = make_run(
        tmp_path / "gelu", vocabularies["first"], dataclasses.replace(CONFIG, activation="gelu"), checkpoint=first
    )
    with pytest.raises(
        ValueError,
        match=rf"^Cannot average {q(first)} with {q(gelu)}: they are checkpoints of "
        r"different models \(model configurations differ: activation 'relu' vs "
        r"'gelu'\)\.$",
    ):
        training.average_checkpoints([first, gelu])
    other = make_run(tmp_path / "other", vocabularies["other"], checkpoint=first)
    with pytest.raises(
        ValueError,
        match=rf"^Cannot average {q(first)} with {q(other)}: .*\(vocabularies "
        r"\(spm.model\) differ: piece \d+ is ",
    ):
        training.average_checkpoints([first, other, first])
    # A checkpoint outside any run cannot be checked: refused beside one of a run.
    loose = str(tmp_path / "loose.weights.h5")
    shutil.copy(first, loose)
    with pytest.raises(
        ValueError,
        match=rf"^Cannot average {q(first)} with {q(loose)}: .*\(the run of {q(first)} "
        r"has a config.json, the other's has none\)",
    ):
        training.average_checkpoints([first, loose], build_model(CONFIG, dtype="float32"))
