"""Fine-tuning / continued training with --init-from: weights, vocabulary and optimizer of another run."""

import os
import shutil

import keras
import numpy as np
import pytest
from conftest import TINY_NET

from keras_transformer import training
from keras_transformer.data import corpora, load_dataset, make_batches
from keras_transformer.run_dir import load_run


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    """A tiny model trained 6 steps on Multi30k, and a tiny parallel text of 64 other pairs."""
    from keras_transformer.data.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("init_from")
    run_dir = root / "base"
    run_dir.mkdir()
    texts = corpora.read_lines("train", "en")[:3000] + corpora.read_lines("train", "de")[:3000]
    train_tokenizer(texts, run_dir / "spm", vocab_size=500)
    args = training.TrainingArgs(
        output=str(run_dir),
        preset="tiny",
        vocab_size=500,
        overrides=TINY_NET,
        batch_tokens=1024,
        max_length=32,
        max_steps=6,
        warmup_steps=4,
        checkpoint_every=3,
        validation_split=None,
        verbose=0,
    )
    training.train(args)
    for lang in ("en", "de"):
        (root / f"new.{lang}").write_text("\n".join(corpora.read_lines("val", lang)[100:164]) + "\n", encoding="utf-8")
    return run_dir, f"files:{root}/new.en,{root}/new.de"


def loss_on(model, tokenizer, spec):
    batches = make_batches(load_dataset(spec, "train"), tokenizer, batch_tokens=1024, max_length=32, shuffle=False)
    return model.evaluate(batches, verbose=0, return_dict=True)["loss"]


def fine_tune_args(output, base_dir, spec, **options):
    values = dict(
        output=str(output),
        data=spec,
        init_from=str(base_dir),
        batch_tokens=256,
        max_length=32,
        max_steps=8,
        warmup_steps=2,
        checkpoint_every=100,
        validation_split=None,
        verbose=0,
        overrides={"dropout": 0.0},
    )
    values.update(options)
    return training.TrainingArgs(**values)


def test_fine_tuning_starts_from_the_runs_weights_and_lowers_the_loss_on_new_data(base_run, tmp_path, capsys):
    base_dir, spec = base_run
    base_model, tokenizer = load_run(str(base_dir))
    before = loss_on(base_model, tokenizer, spec)

    class FirstWeights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.weights = self.model.get_weights()

    first = FirstWeights()
    output = tmp_path / "tuned"
    result = training.train(fine_tune_args(output, base_dir, spec), callbacks=[first])
    assert "initialized from" in capsys.readouterr().out
    for a, b in zip(first.weights, base_model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # The vocabulary is the base run's, byte for byte; the configuration too.
    assert (output / "spm.model").read_bytes() == (base_dir / "spm.model").read_bytes()
    assert result.model.config == base_model.config
    after = loss_on(result.model, result.tokenizer, spec)
    assert after < before - 0.1, (before, after)
    # A fresh optimizer: 8 steps, its own warmup.
    assert int(result.model.optimizer.iterations.numpy()) in (0, 8) and result.step == 8


def test_resume_optimizer_continues_the_step_count(base_run, tmp_path):
    base_dir, spec = base_run

    class Iterations(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start = int(self.model.optimizer.iterations.numpy())

    iterations = Iterations()
    training.train(
        fine_tune_args(tmp_path / "resumed", base_dir, spec, resume_optimizer=True, max_steps=2), callbacks=[iterations]
    )
    assert iterations.start == 6  # the base run's optimizer stopped after 6 updates


def test_resume_optimizer_with_another_ema_is_refused(base_run, tmp_path):
    """Keras would skip the other run's optimizer state (other variables) with a warning only,
    and the run would start with a fresh Adam and warmup while saying it took them."""
    base_dir, spec = base_run
    with pytest.raises(
        ValueError,
        match=r"optimizer state in .*backup.* was not loaded: the optimizer is at 0 "
        r"updates, not 6.*or resume_optimizer False",
    ):
        training.train(fine_tune_args(tmp_path / "ema", base_dir, spec, resume_optimizer=True, ema=0.9))


def test_a_vocabulary_or_architecture_mismatch_is_refused(base_run, tmp_path):
    from keras_transformer.data.tokenizer import train_tokenizer

    base_dir, spec = base_run
    other = tmp_path / "other"
    train_tokenizer(corpora.read_lines("train", "en")[3000:4000], other / "spm", vocab_size=500)
    with pytest.raises(
        ValueError,
        match=r"^output .*other: vocabulary mismatch: .*other/spm.model is not the vocabulary of "
        r".*base, whose weights init_from loads \(piece \d+ is ",
    ):
        training.train(fine_tune_args(other, base_dir, spec))
    broken = tmp_path / "broken"
    broken.mkdir()
    shutil.copy(base_dir / "spm.model", broken / "spm.model")
    with open(broken / "spm.model", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match=r"broken/spm.model is not a SentencePiece model"):
        training.train(fine_tune_args(broken, base_dir, spec))
    with pytest.raises(ValueError, match=r"^init_from .*base: the model's num_layers cannot change"):
        training.train(fine_tune_args(tmp_path / "wider", base_dir, spec, overrides={"num_layers": 3}))
    with pytest.raises(ValueError, match="resume_optimizer needs init_from"):
        training.TrainingArgs(resume_optimizer=True)
    assert not os.path.exists(tmp_path / "wider" / "model.keras")


def test_the_same_vocabulary_trained_again_is_adopted(tmp_path):
    """Each training records its (here temporary) model_prefix in spm.model: the bytes differ, the vocabulary not."""
    from keras_transformer.run_dir import get_or_train_tokenizer
    from keras_transformer.training.init_from import adopt_vocabulary

    texts = corpora.read_lines("train", "en")[:1000] + corpora.read_lines("train", "de")[:1000]
    base, tuned, other = (tmp_path / name for name in ("base", "tuned", "other"))
    get_or_train_tokenizer(base, lambda: texts, vocab_size=400)
    get_or_train_tokenizer(tuned, lambda: texts, vocab_size=400)
    assert (base / "spm.model").read_bytes() != (tuned / "spm.model").read_bytes()
    adopt_vocabulary(str(tuned), str(base))
    get_or_train_tokenizer(other, lambda: texts[:1500], vocab_size=400)
    with pytest.raises(ValueError, match=r"vocabulary mismatch: .*other/spm.model is not the vocabulary of .*base"):
        adopt_vocabulary(str(other), str(base))
