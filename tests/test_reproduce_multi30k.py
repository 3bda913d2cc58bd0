"""examples/reproduce_multi30k.py: the published recipe mapped onto the library, and the run end to end."""

import json
import math
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import reproduce_multi30k as recipe  # noqa: E402


def fairseq_inverse_sqrt(update, lr=0.005, warmup=2000, init=1e-7):
    """fairseq's `inverse_sqrt` scheduler (`fairseq/optim/lr_scheduler/inverse_square_root_schedule.py`)."""
    if update < warmup:
        return init + update * (lr - init) / warmup
    return lr * math.sqrt(warmup) / math.sqrt(update)


@pytest.mark.parametrize("updates_done", [0, 1, 500, 1998, 1999, 2000, 4000, 7999])
def test_equation_3_with_the_recipe_scale_is_fairseqs_inverse_sqrt(updates_done):
    """The same curve, one update apart: equation (3) counts steps from 1, so the schedule at the optimizer's
    iteration i is eq. (3) at step i + 1, while fairseq's first update uses its initial rate (1e-7)."""
    from keras_transformer.optimization import TransformerSchedule

    schedule = TransformerSchedule(recipe.D_MODEL, recipe.RECIPE["warmup_steps"], recipe.RECIPE["lr_scale"])
    ours = float(schedule(updates_done))
    assert ours == pytest.approx(fairseq_inverse_sqrt(updates_done + 1), rel=1e-4, abs=2e-7)


def test_the_recipe_is_transformer_tiny():
    from keras_transformer import TransformerConfig

    config = TransformerConfig.from_preset(recipe.RECIPE["preset"], recipe.RECIPE["vocab_size"], dropout=0.3)
    assert (config.num_layers, config.d_model, config.d_ff, config.num_heads) == (4, 128, 256, 4)
    assert config.share_embeddings and not config.norm_first
    assert recipe.RECIPE["batch_tokens"] == 2 * 4096 and recipe.RECIPE["max_steps"] == 8000
    assert recipe.RECIPE["average_last"] == 10 and (recipe.BEAM, recipe.ALPHA) == (5, 1.0)


def test_fairseq_patience_is_counted_on_validation_loss():
    rows = [{"epoch": str(i), "val_loss": str(loss)} for i, loss in enumerate([3.0, 2.5, 2.4] + [2.41] * 10)]
    assert recipe.patience_stop(rows) == 13  # the 10th epoch without a new best (epochs 3..12, 0-based)
    assert recipe.patience_stop(rows[:12]) is None


def test_a_short_run_trains_resumes_scores_and_exports(tmp_path, monkeypatch):
    """A tiny model on 200 pairs: reproduction.json with both splits, an export, a resume that continues."""
    monkeypatch.setitem(recipe.RECIPE, "preset", "tiny")
    monkeypatch.setitem(recipe.RECIPE, "vocab_size", 400)
    monkeypatch.setitem(recipe.RECIPE, "batch_tokens", 256)
    monkeypatch.setitem(recipe.RECIPE, "max_steps", 4)
    monkeypatch.setitem(recipe.RECIPE, "validate_bleu_every", 4)
    monkeypatch.setitem(recipe.RECIPE, "precision", "float32")
    output = str(tmp_path / "seed3")
    first = recipe.run(3, output, export=False, limit=200)
    assert first["step"] == 4 and first["seed"] == 3
    with open(os.path.join(output, "data", "test2016.en"), encoding="utf-8") as f:
        assert f.read().splitlines()[0] == "a man in an orange hat starring at something ."
    monkeypatch.setitem(recipe.RECIPE, "max_steps", 6)
    report = recipe.run(3, output, export=True, limit=200)
    assert report["step"] == 6 and report["steps_per_epoch"] == first["steps_per_epoch"]
    saved = json.loads(open(os.path.join(output, "reproduction.json"), encoding="utf-8").read())
    for split in ("val", "test2016"):
        assert 0.0 <= saved[split]["tok_bleu"] <= 100.0 and "chrf" in saved[split]["detokenized"]
    assert os.path.exists(os.path.join(report["export_path"], "saved_model.pb"))
    export_info = json.loads(
        open(os.path.join(report["export_path"], "assets", "export.json"), encoding="utf-8").read()
    )
    assert "lower-cased" in json.dumps(export_info)
    assert export_info["decoding"]["length_penalty"] == "average"  # fairseq's --lenpen, as published
    # Scored again with another search: the report keeps what the first one gave.
    monkeypatch.setattr(recipe, "LENGTH_PENALTY", "gnmt")
    again = recipe.run(3, output, export=False, limit=200)
    assert again["length_penalty"] == "gnmt" and again["step"] == 6
    assert again["earlier_searches"] == [
        dict(beam=5, alpha=1.0, length_penalty="average", val=report["val"]["tok_bleu"],
             test2016=report["test2016"]["tok_bleu"])
    ]  # fmt: skip
    results = tmp_path / "new_machine"  # a results directory not made yet is created
    summary = recipe.summarize([output, output], str(results / "summary.json"), str(results / "curves.png"))
    assert summary["test2016"]["sd"] == 0.0 and os.path.getsize(results / "curves.png") > 0
    assert json.loads((results / "summary.json").read_text(encoding="utf-8")) == summary
    assert summary["earlier_searches"][0]["runs"] == 2 and summary["earlier_searches"][0]["length_penalty"] == "average"


def test_a_summary_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A summary that fails halfway (here: a value JSON cannot hold) keeps the file it would have replaced."""
    runs = []
    for seed, bleu in enumerate((40.5, 41.0)):
        run = tmp_path / f"seed{seed}"
        run.mkdir()
        report = dict(seed=seed, train_seconds=3600, val={"tok_bleu": bleu}, test2016={"tok_bleu": bleu - 1})
        (run / "reproduction.json").write_text(json.dumps(report), encoding="utf-8")
        runs.append(str(run))
    path = tmp_path / "new_machine" / "summary.json"  # a results directory not made yet is created
    first = recipe.summarize(runs, str(path))
    assert json.loads(path.read_text(encoding="utf-8")) == first and first["test2016"]["mean"] == 39.75
    monkeypatch.setattr(recipe, "versions", lambda: {"tensorflow": object()})
    with pytest.raises(TypeError, match="not JSON serializable"):
        recipe.summarize(runs, str(path))
    assert json.loads(path.read_text(encoding="utf-8")) == first
    assert os.listdir(path.parent) == ["summary.json"]


def test_an_experiment_is_named_in_the_command_it_records(monkeypatch):
    assert recipe._experiment_flags() == ""  # the published recipe
    monkeypatch.setitem(recipe.RECIPE, "batch_tokens", 9216)
    assert recipe._experiment_flags() == " --batch-tokens 9216"


class _Echo:
    """A translator that answers with the given lines (the references, in one text form or the other)."""

    def __init__(self, lines):
        self.lines = lines

    def translate(self, sources):
        assert len(sources) == len(self.lines)
        return self.lines


def test_raw_text_is_kept_as_written_and_scored_as_published(tmp_path):
    """`text="raw"`: the corpus as written, and the output lower-cased and Moses-tokenized before the published
    BLEU; a run directory keeps its text form."""
    from keras_transformer.data import corpora
    from keras_transformer.inference.evaluation import moses_tokenize_lowercase

    raw, tokenized = str(tmp_path / "raw"), str(tmp_path / "tokenized")
    recipe.prepare_data(raw, limit=20, text="raw")
    recipe.prepare_data(tokenized, limit=20)
    first = "A man in an orange hat starring at something."
    assert open(os.path.join(raw, "data", "test2016.en"), encoding="utf-8").readline().strip() == first
    with pytest.raises(SystemExit, match="holds raw text, not lowercased_tokenized"):
        recipe.prepare_data(raw, limit=20)
    with pytest.raises(SystemExit, match="text must be one of"):
        recipe.prepare_data(str(tmp_path / "other"), limit=20, text="cased")
    references = [line.strip() for line in corpora.read_lines("test2016", "de")[:20]]
    as_raw = recipe.translate_and_score(_Echo(references), raw, "test2016", limit=20, text="raw")
    lines = moses_tokenize_lowercase(references, "de")
    as_tokens = recipe.translate_and_score(_Echo(lines), tokenized, "test2016", limit=20)
    assert as_raw["tok_bleu"] == as_tokens["tok_bleu"] == 100.0
    assert round(as_raw["detokenized"]["bleu"], 6) == 100.0  # the raw output is already detokenized
