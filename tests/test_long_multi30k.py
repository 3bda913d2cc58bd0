"""examples/long_multi30k.py: trials scored on validation only, and the table rewritten from their runs."""

import dataclasses
import json
import os
import shutil
import sys

import numpy as np
import pytest

from keras_transformer.training.callbacks import SIGNAL_AT_STEP_ENVIRONMENT

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import long_multi30k as long  # noqa: E402
import long_searches  # noqa: E402
import reproduce_multi30k as published  # noqa: E402


def test_every_trial_changes_only_training_options_and_says_why():
    from keras_transformer.training import TrainingArgs

    options = set(published.RECIPE) | {field.name for field in dataclasses.fields(TrainingArgs)}
    for name, (changes, why) in long.TRIALS.items():
        assert set(changes) <= options, name
        assert why, name
    assert long.trial_recipe("bpe_dropout_12k")["subword_sampling"] == 0.1
    assert long.CHOSEN is None or long.CHOSEN in long.TRIALS
    with pytest.raises(SystemExit, match="unknown trial 'nope'"):
        long.trial_recipe("nope")
    # A report written before the recipe named its text form had the published one.
    legacy = long._recipe_of(dict(recipe={key: value for key, value in published.RECIPE.items() if key != "text"}))
    assert legacy["text"] == "lowercased_tokenized" and long._changes(legacy) == {}
    assert long._changes(long.trial_recipe("raw_12k"))["text"] == "raw"
    # batch9216_12k continues a `--batch-tokens 9216` reproduction: the two differ in later updates only.
    batch9216 = dict(published.RECIPE, batch_tokens=9216)
    assert long._recipe_differences(batch9216, long.trial_recipe("batch9216_12k"), long.PREFIX_OPTIONS) == []


def test_a_trial_is_scored_on_validation_only_and_lands_in_the_table(tmp_path, monkeypatch, capsys):
    tiny = dict(
        preset="tiny", vocab_size=400, batch_tokens=256, max_steps=4, validate_bleu_every=4, precision="float32"
    )
    for key, value in tiny.items():
        monkeypatch.setitem(published.RECIPE, key, value)
    monkeypatch.setitem(long.TRIALS, "sampled", (dict(subword_sampling=0.1), "a test"))
    output = str(tmp_path / "runs" / "sampled_seed3")
    report = long.run_trial("sampled", 3, output, limit=200)
    assert report["step"] == 4 and "val" in report and "test2016" not in report
    assert not os.path.exists(os.path.join(output, "test2016.hyp.de"))  # test2016 is never decoded for a trial
    assert "--trial sampled --seed 3" in report["command"]
    rows = long.table([str(tmp_path / "runs")], str(tmp_path / "trials.json"))
    assert [(row["trial"], row["seed"], row["changes"]) for row in rows] == [("sampled", 3, {"subword_sampling": 0.1})]
    assert rows[0]["val_tok_bleu"] == report["val"]["tok_bleu"] and rows[0]["updates"] == 4
    written = json.loads((tmp_path / "trials.json").read_text(encoding="utf-8"))
    assert written["rows"] == rows and "--table" in written["command"]
    assert "| sampled | 3 | subword_sampling=0.1 | 4 |" in capsys.readouterr().out
    # A run directory deleted to free the disk keeps its row when the table is rewritten, marked as carried over;
    # the run, found again, replaces it.
    (tmp_path / "elsewhere").mkdir()
    assert long.table([str(tmp_path / "elsewhere")], str(tmp_path / "trials.json")) == [
        dict(rows[0], carried_over=True)
    ]
    assert "(carried over) |" in capsys.readouterr().out
    assert long.table([str(tmp_path / "runs")], str(tmp_path / "trials.json")) == rows
    # A run that has not finished (no report yet) is listed by its trial.json, with its last validation loss.
    os.remove(os.path.join(output, "reproduction.json"))
    (running,) = long.trial_rows([str(tmp_path / "runs")])
    assert (running["trial"], running["status"], running["updates"], running["val_tok_bleu"]) == (
        "sampled",
        "running",
        4,
        None,
    )
    assert 0.0 < running["val_loss"] < 20.0
    monkeypatch.setitem(long.STOPPED, "sampled", "a reason")
    assert long.trial_rows([str(tmp_path / "runs")])[0]["status"] == "stopped: a reason"
    # A run of reproduce_multi30k.py (no trial named, the published recipe) is a row of the "published" trial.
    reproduction = dict(report, recipe=dict(published.RECIPE))
    del reproduction["trial"]
    (tmp_path / "reproduce" / "seed0").mkdir(parents=True)
    (tmp_path / "reproduce" / "seed0" / "reproduction.json").write_text(json.dumps(reproduction), encoding="utf-8")
    rows = long.trial_rows([str(tmp_path / "runs"), str(tmp_path / "reproduce")])
    assert [(row["trial"], row["changes"]) for row in rows] == [
        ("published", {}),
        ("sampled", {"subword_sampling": 0.1}),
    ]


def _no_training(*args, **kwargs):
    raise AssertionError("the refusal did not come: the recipe would have trained")


def test_the_chosen_recipe_refuses_to_run_before_a_choice_or_on_another_run(monkeypatch, tmp_path):
    monkeypatch.setattr(published, "run", _no_training)  # a broken refusal fails here rather than training
    monkeypatch.setattr(long, "CHOSEN", None)
    with pytest.raises(SystemExit, match="no recipe chosen"):
        long.run_chosen(0, str(tmp_path / "seed0"))
    # Nor on another trial's run, or another seed's.
    monkeypatch.setattr(long, "CHOSEN", "mini_12k")
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "trial.json").write_text(json.dumps(dict(trial="small_drop0.3_7k", seed=0)))
    with pytest.raises(SystemExit, match="holds seed 0 of trial small_drop0.3_7k, not seed 0 of the chosen mini_12k"):
        long.run_chosen(0, str(tmp_path / "seed0"))
    (tmp_path / "seed0" / "trial.json").write_text(json.dumps(dict(trial="mini_12k", seed=1)))
    with pytest.raises(SystemExit, match="holds seed 1 of trial mini_12k, not seed 0"):
        long.run_chosen(0, str(tmp_path / "seed0"))


def test_start_from_is_refused_without_a_trial(capsys, monkeypatch):
    monkeypatch.setattr(published, "run", _no_training)
    with pytest.raises(SystemExit):
        long.main(["--seed", "0", "--start-from", "runs/long/mini_12k_seed0"])
    assert "--start-from continues a run as a trial: give --trial NAME too" in capsys.readouterr().err


def test_a_run_that_cooled_down_is_not_continued(tmp_path, monkeypatch):
    """Its rate fell to zero by its last update: a trial with more updates would have run at a higher rate there."""
    monkeypatch.setattr(published, "run", _no_training)
    run_dir = tmp_path / "cooled"
    (run_dir / "backup").mkdir(parents=True)
    recipe = dict(long.trial_recipe("published"), max_steps=15, cooldown=0.2)
    (run_dir / "reproduction.json").write_text(json.dumps(dict(seed=0, recipe=recipe)), encoding="utf-8")
    (run_dir / "backup" / "state.json").write_text(json.dumps(dict(step=15)), encoding="utf-8")
    monkeypatch.setitem(long.TRIALS, "more", (dict(max_steps=20, cooldown=0.2), "a test"))
    with pytest.raises(SystemExit, match=r"cannot start from .*cooled: max_steps \(15 -> 20\)"):
        long.run_trial("more", 0, str(tmp_path / "more"), from_run=str(run_dir))
    assert not (tmp_path / "more").exists()


def test_main_trains_seed_0_unless_told(monkeypatch):
    seen = []
    monkeypatch.setattr(long, "run_trial", lambda name, seed, output, *rest: seen.append((name, seed, output)))
    monkeypatch.setattr(long, "run_chosen", lambda seed, output, limit: seen.append((seed, output)))
    long.main(["--trial", "published"])
    long.main([])
    long.main(["--seed", "2"])
    assert seen == [("published", 0, "runs/long/published_seed0"), (0, "runs/long/seed0"), (2, "runs/long/seed2")]


def test_a_trial_started_from_a_run_is_that_trial_interrupted_where_the_run_ended(tmp_path, monkeypatch):
    """`--start-from`: a 6-update trial whose cooldown starts after update 4, continued from a finished 4-update
    run of the same seed, ends exactly where the same trial trained from scratch ends when it is interrupted
    after update 4 and resumed (a resume draws new dropout masks); other changes are refused."""
    tiny = dict(
        preset="tiny", vocab_size=400, batch_tokens=256, max_steps=4, validate_bleu_every=None, precision="float32"
    )
    for key, value in tiny.items():
        monkeypatch.setitem(published.RECIPE, key, value)
    monkeypatch.setitem(long.TRIALS, "longer", (dict(max_steps=6, cooldown=1 / 3), "a test"))
    monkeypatch.setitem(long.TRIALS, "wetter", (dict(max_steps=6, dropout=0.5), "a test"))
    first = long.run_trial("published", 1, str(tmp_path / "first"), limit=120)
    assert first["step"] == 4
    with pytest.raises(SystemExit, match=r"cannot start from .*first: dropout \(0.3 -> 0.5\)"):
        long.run_trial("wetter", 1, str(tmp_path / "wet"), limit=120, from_run=str(tmp_path / "first"))
    with pytest.raises(SystemExit, match=r"seed \(1 -> 2\)"):
        long.run_trial("longer", 2, str(tmp_path / "seed2"), limit=120, from_run=str(tmp_path / "first"))
    assert not os.path.exists(tmp_path / "wet") and not os.path.exists(tmp_path / "seed2")

    continued = long.run_trial("longer", 1, str(tmp_path / "continued"), limit=120, from_run=str(tmp_path / "first"))
    monkeypatch.setenv(SIGNAL_AT_STEP_ENVIRONMENT, "4")
    with pytest.raises(KeyboardInterrupt):
        long.run_trial("longer", 1, str(tmp_path / "fresh"), limit=120)
    monkeypatch.delenv(SIGNAL_AT_STEP_ENVIRONMENT)
    fresh = long.run_trial("longer", 1, str(tmp_path / "fresh"), limit=120)
    assert continued["step"] == fresh["step"] == 6
    assert (continued["started_from"], continued["started_at"]) == (str(tmp_path / "first"), 4)
    assert "--start-from" in continued["command"] and "started_from" not in fresh
    state = "backup/state-00000006.weights.h5"
    continued_state, fresh_state = _arrays(tmp_path / "continued" / state), _arrays(tmp_path / "fresh" / state)
    assert sorted(continued_state) == sorted(fresh_state)
    assert [name for name in continued_state if continued_state[name] != fresh_state[name]] == []
    assert continued["val_metrics"] == fresh["val_metrics"]
    # Started again after an interruption, the trial resumes its own directory rather than copying again.
    again = long.run_trial("longer", 1, str(tmp_path / "continued"), limit=120, from_run=str(tmp_path / "first"))
    assert again["val_metrics"] == continued["val_metrics"]


def _arrays(path):
    """Every array of a Keras weights file (weights and optimizer state), as {name: bytes}."""
    import h5py

    arrays = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: arrays.update({name: item[()].tobytes()}) if hasattr(item, "shape") else None)
    return arrays


def test_commit_refuses_before_decoding_anything(tmp_path, monkeypatch, capsys):
    """`--commit` refuses an unfinished run, a run of lower-cased text, a run its trial has changed since, and a
    base whose version 1 is not an export (which stays as it was), before anything is scored."""
    monkeypatch.setattr(published, "run", _no_training)
    monkeypatch.setitem(long.TRIALS, "raw_tiny", (dict(text="raw"), "a test"))
    run_dir, base = tmp_path / "raw_tiny_seed2", tmp_path / "saved_models" / "m"
    run_dir.mkdir()
    with pytest.raises(SystemExit, match=f"{run_dir} holds no finished trial"):
        long.commit(str(run_dir), str(base))
    (run_dir / "trial.json").write_text(json.dumps(dict(trial="raw_tiny", seed=2, command="c")), encoding="utf-8")
    recipe = long.trial_recipe("raw_tiny")
    (run_dir / "reproduction.json").write_text(json.dumps(dict(recipe=recipe)), encoding="utf-8")
    (base / "1").mkdir(parents=True)
    (base / "1" / "notes.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(FileExistsError, match="is not a keras-transformer export"):
        long.commit(str(run_dir), str(base))
    assert (base / "1" / "notes.txt").read_text(encoding="utf-8") == "mine"
    monkeypatch.setitem(long.TRIALS, "raw_tiny", (dict(text="raw", max_steps=9), "a test, changed"))
    with pytest.raises(SystemExit, match=r"was trained before trial raw_tiny changed: max_steps \(8000 -> 9\)$"):
        long.commit(str(run_dir), str(base))
    (run_dir / "trial.json").write_text(json.dumps(dict(trial="published", seed=2, command="c")), encoding="utf-8")
    with pytest.raises(SystemExit, match="is trial published, which reads lower-cased Moses-tokenized English"):
        long.commit(str(run_dir), str(base))
    with pytest.raises(SystemExit):
        long.main(["--commit", str(run_dir), "--limit", "5"])
    assert "--commit with --limit scores a few sentences: give --output" in capsys.readouterr().err
    for flags in (["--trial", "raw_tiny"], ["--seed", "0"], ["--plot", "p.png"], ["--start-from", "r"]):
        with pytest.raises(SystemExit):
            long.main(["--commit", str(run_dir), *flags])
        assert (
            f"--commit takes the run's own trial and seed and plots nothing: drop {flags[0]}" in capsys.readouterr().err
        )
    for flags, tasks in (
        (["--commit", str(run_dir), "--table", "a"], "--table, --commit"),
        (["--commit", str(run_dir), "--ensembles", "a,b"], "--ensembles, --commit"),
        (["--commit", str(run_dir), "--summarize", "a"], "--commit, --summarize"),
        (["--table", "a", "--summarize", "b"], "--table, --summarize"),
        (["--summarize", "a", "--trial", "mini_12k"], "--summarize, --trial"),
    ):  # refused, not silently the first of them
        with pytest.raises(SystemExit):
            long.main(flags)
        assert f"{tasks} are separate tasks: give one of them" in capsys.readouterr().err


def test_commit_scores_test2016_and_replaces_the_committed_version(tmp_path, monkeypatch):
    """`--commit`: a finished run of raw text is scored on test2016 and exported over version 1 of the base
    directory (again: replaced, not added beside) with its trial, recipe, seed, machine and scores; the trials
    table keeps the trial's own command."""
    tiny = dict(
        preset="tiny", vocab_size=400, batch_tokens=256, max_steps=4, validate_bleu_every=None, precision="float32"
    )
    for key, value in tiny.items():
        monkeypatch.setitem(published.RECIPE, key, value)
    monkeypatch.setitem(long.TRIALS, "raw_tiny", (dict(text="raw"), "a test"))
    base, run_dir = tmp_path / "saved_models" / "m", str(tmp_path / "runs" / "raw_tiny_seed2")
    trial = long.run_trial("raw_tiny", 2, run_dir, limit=60)
    assert "test2016" not in trial
    for _ in range(2):  # the second commit replaces version 1 rather than adding version 2
        path = long.commit(run_dir, str(base), limit=60, json_path=str(tmp_path / "committed.json"))
    assert path == str(base / "1") and sorted(os.listdir(base)) == ["1"]
    report = json.loads((tmp_path / "runs" / "raw_tiny_seed2" / "reproduction.json").read_text(encoding="utf-8"))
    assert report["val"] == trial["val"] and "tok_bleu" in report["test2016"]
    assert json.loads((tmp_path / "committed.json").read_text(encoding="utf-8")) == dict(report, committed_as=path)
    assert "--limit 60" in report["command"] and f"--output {base}" in report["command"]
    info = json.loads((base / "1" / "assets" / "export.json").read_text(encoding="utf-8"))
    metadata = info["metadata"]
    assert (metadata["trial"], metadata["seed"], metadata["recipe"]["text"]) == ("raw_tiny", 2, "raw")
    assert metadata["test2016"] == report["test2016"] and metadata["val"] == report["val"]
    assert metadata["machine"]["flags"] and metadata["input"] == "English as written"
    assert "--trial raw_tiny --seed 2" in metadata["trial_command"] and "--commit" in metadata["command"]
    decoding = info["decoding"]
    assert (decoding["beam_size"], decoding["alpha"]) == (published.BEAM, published.ALPHA)
    assert decoding["length_penalty"] == published.LENGTH_PENALTY
    (row,) = long.trial_rows([str(tmp_path / "runs")])
    assert row["command"] == trial["command"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run of the published recipe shrunk to a tiny model and 4 updates (seed 1, 60 pairs) and its
    report, shared by the decode-only studies, which write nothing into it."""
    run = str(tmp_path_factory.mktemp("long") / "published_seed1")
    with pytest.MonkeyPatch.context() as patch:
        tiny = dict(
            preset="tiny", vocab_size=400, batch_tokens=256, max_steps=4, validate_bleu_every=None, precision="float32"
        )
        for key, value in tiny.items():
            patch.setitem(published.RECIPE, key, value)
        return run, long.run_trial("published", 1, run, limit=60)


def test_ensembles_score_validation_and_a_run_with_itself_scores_as_alone(tmp_path, finished_run):
    """`--ensembles`: a run ensembled with itself decodes validation exactly as alone (its log-probabilities
    averaged with themselves), so the row's gain is 0; runs of different text forms are refused."""
    run, report = finished_run
    (row,) = long.ensembles([[run, run]], str(tmp_path / "ensembles.json"))
    assert row["val_tok_bleu"] == report["val"]["tok_bleu"] and row["gain_over_members_mean"] == 0.0
    assert row["members_val_tok_bleu"] == [report["val"]["tok_bleu"]] * 2 and row["seeds"] == [1, 1]
    written = json.loads((tmp_path / "ensembles.json").read_text(encoding="utf-8"))
    assert written["rows"] == [row] and f"--ensembles {run},{run}" in written["command"]
    raw = tmp_path / "raw"
    raw.mkdir()
    raw_report = dict(report, recipe=dict(report["recipe"], text="raw"))
    (raw / "reproduction.json").write_text(json.dumps(raw_report), encoding="utf-8")
    with pytest.raises(SystemExit, match="read different text forms"):
        long.ensembles([[run, str(raw)]])


def test_length_penalties_score_validation_per_alpha_and_the_recipe_s_alpha_as_the_run(
    tmp_path, monkeypatch, capsys, finished_run
):
    """`--length-penalties`: one row per run and alpha, the recipe's alpha giving the run's own validation score,
    and the mean per alpha; test2016 is not decoded."""
    run, report = finished_run
    json_path = str(tmp_path / "new_machine" / "penalties.json")  # the directory is created
    from keras_transformer.inference.translator import Translator

    searched, init = [], Translator.__init__
    monkeypatch.setattr(
        Translator, "__init__", lambda self, *a, **k: searched.append(k["alpha"]) or init(self, *a, **k)
    )
    splits, score = [], published.translate_and_score
    monkeypatch.setattr(
        published,
        "translate_and_score",
        lambda t, o, split, *a, **k: splits.append(split) or score(t, o, split, *a, **k),
    )
    assert long.main(["--length-penalties", run, "--alphas", f"{published.ALPHA},3", "--json", json_path]) == 0
    written = json.loads((tmp_path / "new_machine" / "penalties.json").read_text(encoding="utf-8"))
    rows = written["rows"]
    assert [(row["run"], row["seed"], row["alpha"]) for row in rows] == [(run, 1, published.ALPHA), (run, 1, 3.0)]
    assert rows[0]["val_tok_bleu"] == report["val"]["tok_bleu"] and searched == [published.ALPHA, 3.0]
    assert splits == ["val", "val"]  # test2016 is never decoded
    expected = (
        f"python examples/long_multi30k.py --length-penalties {run} --alphas {published.ALPHA},3.0 --json {json_path}"
    )
    assert written["command"] == expected
    assert "mean per alpha" in capsys.readouterr().out
    # The mean per alpha is over the runs.
    other = str(tmp_path / "published_seed1_copy")
    shutil.copytree(run, other)
    fake = {(run, 1.0): 40.0, (run, 2.0): 41.0, (other, 1.0): 42.0, (other, 2.0): 44.0}
    monkeypatch.setattr(
        long_searches,
        "validation_score",
        lambda translator, r, text: dict(tok_bleu=fake[r, translator.alpha], tok_bleu_details=""),
    )
    _, means = long_searches.length_penalties([run, other], [1.0, 2.0])
    assert means == {"1.0": 41.0, "2.0": 42.5}
    for alphas, message in (("1,x", "got 'x'"), ("-1", "got '-1'"), ("nan", "got 'nan'")):
        with pytest.raises(SystemExit):
            long.main(["--length-penalties", run, "--alphas", alphas])
        assert f"--alphas {alphas}: alpha must be >= 0 and finite, {message}" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        long.main(["--table", run, "--alphas", "1.2"])
    assert "--alphas goes with --length-penalties" in capsys.readouterr().err


def _kept_checkpoints(run, directory, scales):
    """Checkpoints kept beside copies of the run's config and vocabulary: the run's one checkpoint (update 4) and,
    at updates 2, 3, ..., its weights times `scales`."""
    from keras_transformer.run_dir import CONFIG_FILENAME, TOKENIZER_FILENAME, load_run

    shutil.copytree(os.path.join(run, "checkpoints"), directory / "checkpoints")
    for name in (CONFIG_FILENAME, TOKENIZER_FILENAME):
        shutil.copy(os.path.join(run, name), directory / name)
    model, _ = load_run(run, dtype="float32")
    weights = model.get_weights()
    for step, scale in enumerate(scales, start=2):
        model.set_weights([w * scale for w in weights])
        model.save_weights(str(directory / "checkpoints" / f"ckpt-{step:08d}.weights.h5"))
    (directory / "checkpoints" / "ckpt-00000099.weights.h5").write_bytes(b"not a checkpoint")  # after update 4
    return weights[0]


def test_averaging_windows_score_validation_and_the_run_s_own_window_as_the_run(tmp_path, capsys, finished_run):
    """`--averaging-windows`: the run's own window first, reproducing its validation score, then one row per
    window over the checkpoints kept elsewhere (those after the run's last update ignored), in the results file
    with the command that wrote it."""
    run, report = finished_run
    kept = tmp_path / "kept"
    _kept_checkpoints(run, kept, scales=(1.0, 1.0))
    json_path = str(tmp_path / "windows.json")
    args = ["--averaging-windows", run, "--windows", "2,1", "--checkpoints", str(kept), "--json", json_path]
    assert long.main(args) == 0
    written = json.loads(open(json_path, encoding="utf-8").read())
    rows, own = written["rows"], report["training"]["average_last"]
    assert [(row["window"], row["steps"]) for row in rows] == [(own, [2, 3, 4]), (1, [4]), (2, [3, 4])]
    assert rows[0]["val_details"] == report["val"]["tok_bleu_details"]
    assert (written["own_window"], written["seed"], written["run"]) == (own, 1, run)
    assert written["command"] == f"python examples/long_multi30k.py {' '.join(args)}"
    assert "last 2 (3-4)" in capsys.readouterr().out


def test_averaging_windows_decode_the_average_of_the_chosen_checkpoints(tmp_path, monkeypatch, finished_run):
    """Each window decodes the mean of its checkpoints (here the run's weights times 0 and 2 at updates 2 and 3):
    w, (2w + w) / 2 and (0 + 2w + w) / 3; a window beyond the checkpoints is refused before anything is decoded."""
    run, report = finished_run
    first = _kept_checkpoints(run, tmp_path / "kept", scales=(0.0, 2.0))
    decoded = []

    def spy(translator, r, text):
        decoded.append(translator.model.get_weights()[0])
        return dict(tok_bleu=report["val"]["tok_bleu"], tok_bleu_details=report["val"]["tok_bleu_details"])

    monkeypatch.setattr(long_searches, "validation_score", spy)
    with pytest.raises(SystemExit, match="holds 3 checkpoints up to update 4, fewer than a window of 4"):
        long_searches.averaging_windows(run, [4, 1], str(tmp_path / "kept"))
    assert decoded == []
    long_searches.averaging_windows(run, [1, 2, 3], str(tmp_path / "kept"))
    own = report["training"]["average_last"]
    expected = {1: first, 2: 1.5 * first, 3: first, own: first}
    for window, weights in zip([own, 1, 2, 3], decoded):
        np.testing.assert_allclose(weights, expected[window], rtol=1e-6, atol=1e-7)


def test_averaging_windows_refuse_what_they_cannot_study(tmp_path, capsys, finished_run):
    run, report = finished_run

    def altered(name, **changes):
        directory = tmp_path / name
        shutil.copytree(run, directory)
        (directory / "reproduction.json").write_text(json.dumps(dict(report, **changes)), encoding="utf-8")
        return str(directory)

    details = report["val"]["tok_bleu_details"].replace("hyp_len = ", "hyp_len = 1")
    with pytest.raises(SystemExit, match="does not average or search as the run did"):
        long_searches.averaging_windows(altered("other", val=dict(report["val"], tok_bleu_details=details)), [1])
    with pytest.raises(SystemExit, match=r"not the average of its last checkpoints \(ema 0.999"):
        long_searches.averaging_windows(altered("ema", training=dict(report["training"], ema=0.999)), [1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="--checkpoints .*empty holds no checkpoints/ckpt"):
        long_searches.averaging_windows(run, [1], str(tmp_path / "empty"))
    _kept_checkpoints(run, tmp_path / "bare", scales=(1.0,))
    os.remove(tmp_path / "bare" / "config.json")  # checkpoints whose model cannot be checked
    with pytest.raises(SystemExit, match="--checkpoints .*bare: Cannot average .* has a config.json, the other's has"):
        long_searches.averaging_windows(run, [1], str(tmp_path / "bare"))
    for flags, message in (
        (["--averaging-windows", run, "--windows", "0,2"], "--windows 0,2: give comma-separated checkpoint counts"),
        (["--averaging-windows", run, "--windows", "x"], "--windows x: give comma-separated checkpoint counts"),
        (["--table", "runs", "--windows", "5"], "--windows and --checkpoints go with --averaging-windows"),
    ):
        with pytest.raises(SystemExit):
            long.main(flags)
        assert message in capsys.readouterr().err
