"""BLEU on the validation split during training: logged, the best kept, early stopping on it."""

import csv
import glob
import json
import os
import shutil

import pytest

from keras_transformer import training
from keras_transformer.data import corpora
from keras_transformer.inference.evaluation import corpus_scores
from keras_transformer.inference.translator import Translator
from keras_transformer.run_dir import load_run

TRAIN_PAIRS, VAL_PAIRS = 300, 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Aligned files `{train,val}.{en,de}` (Multi30k's first pairs) and a 500-piece vocabulary."""
    from keras_transformer.data.tokenizer import train_tokenizer

    directory = tmp_path_factory.mktemp("corpus")
    for split, source_split, count in (("train", "train", TRAIN_PAIRS), ("val", "val", VAL_PAIRS)):
        for lang in ("en", "de"):
            lines = corpora.read_lines(source_split, lang)[:count]
            (directory / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    texts = corpora.read_lines("train", "en")[:2000] + corpora.read_lines("train", "de")[:2000]
    train_tokenizer(texts, directory / "spm", vocab_size=500)
    return directory


def tiny_args(corpus, output, **options):
    run_dir = output
    os.makedirs(run_dir, exist_ok=True)
    shutil.copy(corpus / "spm.model", os.path.join(run_dir, "spm.model"))
    values = dict(
        output=str(run_dir),
        data=f"files:{corpus}/{{split}}.{{src}},{corpus}/{{split}}.{{tgt}}",
        preset="tiny",
        vocab_size=500,
        overrides={"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64},
        batch_tokens=1024,
        warmup_steps=4,
        max_steps=6,
        checkpoint_every=2,
        keep_checkpoints=10,
        validate_bleu_every=2,
        verbose=0,
    )
    values.update(options)
    return training.TrainingArgs(**values)


def read_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def test_validation_bleu_is_logged_and_the_best_weights_kept(corpus, tmp_path, capsys, monkeypatch):
    """The validator translates greedily (its default search) with the weights of the step, and logs
    the BLEU of those translations; the best weights are kept apart."""
    scored = []  # the validator's hypotheses and references, one pair per validation

    def recording_scores(hypotheses, references, lang="de"):
        scored.append((list(hypotheses), list(references)))
        return corpus_scores(hypotheses, references, lang=lang)

    monkeypatch.setattr("keras_transformer.inference.evaluation.corpus_scores", recording_scores)
    run_dir = tmp_path / "run"
    result = training.train(tiny_args(corpus, run_dir, keep_best=True))
    out = capsys.readouterr().out
    rows = read_rows(run_dir / "bleu.csv")
    assert [int(r["step"]) for r in rows] == [2, 4, 6]
    assert "step 6: validation BLEU" in out

    # The BLEU of step 6 is that of the step-6 weights translating the validation split greedily:
    # the validator's own translations are those of a greedy decode of the step-6 checkpoint, string
    # for string (the BLEU alone, ~0 after 6 steps, would not tell greedy from beam search).
    sources = corpora.read_lines("val", "en")[:VAL_PAIRS]
    references = corpora.read_lines("val", "de")[:VAL_PAIRS]
    model, tokenizer = load_run(str(run_dir), checkpoint=str(run_dir / "checkpoints" / "ckpt-00000006.weights.h5"))
    hypotheses = Translator(model, tokenizer, beam_size=1).translate(sources)
    assert len(scored) == 3
    assert scored[-1] == (hypotheses, references)
    assert float(rows[-1]["bleu"]) == pytest.approx(corpus_scores(hypotheses, references)["bleu"], abs=1e-3)
    assert result.val_bleu[0] == 6 and result.val_bleu[1] == pytest.approx(float(rows[-1]["bleu"]), abs=1e-3)

    # The best is the first maximum; its weights are kept apart from the rotated checkpoints.
    bleus = [float(r["bleu"]) for r in rows]
    best_step = [2, 4, 6][bleus.index(max(bleus))]
    info = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert info["step"] == best_step == result.best_val_bleu[0]
    best_model, _ = load_run(str(run_dir), checkpoint=str(run_dir / "checkpoints" / "best.weights.h5"))
    step_model, _ = load_run(str(run_dir), checkpoint=str(run_dir / "checkpoints" / f"ckpt-{best_step:08d}.weights.h5"))
    for a, b in zip(best_model.get_weights(), step_model.get_weights()):
        assert (a == b).all()

    history = read_rows(run_dir / "history.csv")
    assert "val_bleu" in history[0] and float(history[-1]["val_bleu"]) == pytest.approx(bleus[-1], abs=1e-3)
    assert glob.glob(str(run_dir / "logs" / "validation_bleu" / "events.out.tfevents.*"))


def test_early_stopping_stops_after_patience_validations_without_improvement(corpus, tmp_path, monkeypatch):
    scores = iter([10.0, 12.0, 11.0, 11.5, 9.0, 8.0])  # best at the 2nd validation, then 2 without improvement

    def fake_scores(hypotheses, references, lang="de"):
        return {"bleu": next(scores)}

    monkeypatch.setattr("keras_transformer.inference.evaluation.corpus_scores", fake_scores)
    run_dir = tmp_path / "run"
    result = training.train(
        tiny_args(corpus, run_dir, max_steps=12, validate_bleu_every=1, early_stopping_patience=2, checkpoint_every=100)
    )
    assert result.early_stopped and result.step == 4
    assert result.best_val_bleu == (2, 12.0)
    assert [int(r["step"]) for r in read_rows(run_dir / "bleu.csv")] == [1, 2, 3, 4]
    # The stop is a checkpoint like any other, and the final model is written.
    assert os.path.exists(run_dir / "checkpoints" / "ckpt-00000004.weights.h5")
    assert os.path.exists(run_dir / "model.keras")


def test_bleu_options_need_a_validation_split_and_each_other():
    with pytest.raises(ValueError, match="validate_bleu_every needs a validation_split"):
        training.TrainingArgs(validate_bleu_every=10, validation_split=None)
    with pytest.raises(ValueError, match="keep_best needs validate_bleu_every"):
        training.TrainingArgs(keep_best=True)
    with pytest.raises(ValueError, match="bleu_search"):
        training.TrainingArgs(validate_bleu_every=10, bleu_search="sampling")


def test_a_resumed_run_keeps_its_best_bleu_and_validations_without_improvement(tmp_path, monkeypatch):
    """The best, the latest and the count toward early stopping come from the rows of bleu.csv up to
    the resume step (later rows are the interrupted process's, and will be redone); every worker
    reads the chief's file, so that all stop at the same step."""
    from types import SimpleNamespace

    from keras_transformer.training import validation_bleu

    (tmp_path / "bleu.csv").write_text("step,bleu,seconds\n100,30.0,1.0\n200,25.0,1.0\n300,31.0,1.0\n")
    chief = SimpleNamespace(path=lambda *parts: os.path.join(tmp_path, *parts), is_chief=True, run_dir=str(tmp_path))
    worker = SimpleNamespace(
        path=lambda *parts: os.path.join(tmp_path, "worker-1", *parts), is_chief=False, run_dir=str(tmp_path)
    )

    def resumed(run, start_step):
        return validation_bleu.ValidationBleu(run, None, ["s"], ["r"], 100, patience=2, start_step=start_step)

    for run in (chief, worker):
        validator = resumed(run, 200)
        assert (validator.best, validator.latest, validator.without_improvement) == ((100, 30.0), (200, 25.0), 1)
    fresh = resumed(chief, 0)
    assert (fresh.best, fresh.latest, fresh.without_improvement) == (None, None, 0)
    assert resumed(chief, 300).best == (300, 31.0)

    # Step 300 again, with 26 (not 31) this time: the second validation in a row below 30, so early stopping stops.
    monkeypatch.setattr(
        "keras_transformer.inference.evaluation.corpus_scores", lambda hypotheses, references, lang=None: {"bleu": 26.0}
    )
    monkeypatch.setattr(
        validation_bleu.ValidationBleu,
        "_translator_for",
        lambda self, model: SimpleNamespace(translate=lambda sources: sources),
    )
    validator = resumed(chief, 200)
    assert validator(None, 300) is True
    assert (validator.best, validator.latest, validator.without_improvement) == ((100, 30.0), (300, 26.0), 2)
