"""Decode-only studies of the long recipe's finished runs, on validation only: what ensembles would gain, and
whether the search's length penalty or a wider checkpoint average leaves BLEU on the table.

`examples/long_multi30k.py` runs them (`--ensembles`, `--length-penalties`, `--averaging-windows`); test2016 is
never decoded here.
"""

import json
import os
import shutil
import statistics
import tempfile
import time

import reproduce_multi30k as published


def read_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def validation_score(translator, run, text):
    """`published.translate_and_score` on `run`'s own validation split (`--limit` shortens it), its hypotheses
    written to a scratch directory rather than beside the run's."""
    sources = os.path.join(run, "data", "val.en")
    with open(sources, encoding="utf-8") as f:
        limit = len(f.read().splitlines())
    with tempfile.TemporaryDirectory() as scratch:
        os.makedirs(os.path.join(scratch, "data"))
        shutil.copy(sources, os.path.join(scratch, "data", "val.en"))
        return published.translate_and_score(translator, scratch, "val", limit, text=text)


def recipe_of(report):
    """The recipe a run's report records, with the defaults of options added since it was written."""
    return {**published.LEGACY_RECIPE, **report["recipe"]}


def text_form(report):
    """The text form a run's report records (reports written before the recipe named it had the published one)."""
    return recipe_of(report)["text"]


def _report(json_path, command, rows, **fields):
    date = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    machine, versions = published.machine(), published.versions()
    report = dict(command=f"{command} --json {json_path}", date=date, versions=versions, machine=machine)
    published.write_json(json_path, dict(report, **fields, rows=rows))


def ensembles(groups, json_path=None):
    """Validation BLEU of ensembles of finished runs, each against its members alone; returns the rows.

    Evidence for what could close the gap to 42.0, not a recipe: each member is a run of its own, so an ensemble
    costs the sum of its members' training. Each group (two or more run directories of one text form) decodes
    validation with the recipe's search, the models' log-probabilities averaged at every step
    (`keras_transformer.Ensemble`).
    """
    from keras_transformer.inference.ensembles import ensemble_translator

    rows = []
    for group in groups:
        reports = [read_json(os.path.join(run, "reproduction.json")) for run in group]
        forms = {text_form(report) for report in reports}
        if len(forms) > 1:
            raise SystemExit(f"long_multi30k: the runs {', '.join(group)} read different text forms {sorted(forms)}")
        translator = ensemble_translator(
            group, beam_size=published.BEAM, alpha=published.ALPHA, length_penalty=published.LENGTH_PENALTY
        )
        bleu = validation_score(translator, group[0], forms.pop())["tok_bleu"]
        members = [r["val"]["tok_bleu"] for r in reports]
        rows.append(
            dict(
                runs=list(group),
                trials=[r.get("trial", "published") for r in reports],
                seeds=[r["seed"] for r in reports],
                members_val_tok_bleu=members,
                val_tok_bleu=bleu,
                gain_over_members_mean=round(bleu - statistics.mean(members), 2),
                train_hours=round(sum((r["train_seconds"] or 0) for r in reports) / 3600, 2),
            )
        )
        print(f"{' + '.join(group)}: val {bleu:.2f} (members {' / '.join(f'{m:.2f}' for m in members)})")
    if json_path:
        command = "python examples/long_multi30k.py --ensembles " + " ".join(",".join(g) for g in groups)
        search = dict(beam=published.BEAM, alpha=published.ALPHA, length_penalty=published.LENGTH_PENALTY)
        _report(json_path, command, rows, search=search)
    return rows


def length_penalties(runs, alphas, json_path=None):
    """Validation BLEU of each finished run searched with each `alpha` of the recipe's length normalization
    (log P / length ** alpha, beam 5); returns the rows, one per run and alpha, and the mean over the runs per alpha.

    The recipe searches as fairseq does (alpha 1.0); some runs' outputs run short on validation (`batch9216_12k`'s:
    brevity penalty about 0.96), and a larger alpha, which favours longer outputs, is the search's own lever.
    Chosen on validation only.
    """
    from keras_transformer.inference.translator import Translator
    from keras_transformer.run_dir import load_run

    rows = []
    for run in runs:
        report = read_json(os.path.join(run, "reproduction.json"))
        model, tokenizer = load_run(run, dtype="float32")
        for alpha in alphas:
            translator = Translator(
                model, tokenizer, beam_size=published.BEAM, alpha=alpha, length_penalty=published.LENGTH_PENALTY
            )
            score = validation_score(translator, run, text_form(report))
            rows.append(dict(run=run, trial=report.get("trial", "published"), seed=report["seed"], alpha=alpha,
                             val_tok_bleu=score["tok_bleu"], val_details=score["tok_bleu_details"]))  # fmt: skip
            print(f"{run} alpha {alpha}: {score['tok_bleu_details']}")
    means = {str(a): round(statistics.mean(r["val_tok_bleu"] for r in rows if r["alpha"] == a), 2) for a in alphas}
    print("mean per alpha: " + ", ".join(f"{alpha} {bleu:.2f}" for alpha, bleu in means.items()))
    if json_path:
        command = "python examples/long_multi30k.py --length-penalties " + " ".join(runs)
        command += " --alphas " + ",".join(str(a) for a in alphas)
        _report(json_path, command, rows, search=dict(beam=published.BEAM, length_penalty=published.LENGTH_PENALTY),
                mean_val_tok_bleu=means)  # fmt: skip
    return rows, means


def averaging_windows(run, windows, checkpoints=None, json_path=None):
    """Validation BLEU of a finished run with its last K checkpoints averaged, for each K of `windows`.

    The recipe averages the last 10 epoch checkpoints (fairseq's `average_checkpoints.py --num-epoch-checkpoints
    10`, as the authors evaluate), about 630 updates of a 12,000-update run; the paper averages 5 or 20 (§6.1). A
    wider window is the averaging's own lever, and costs no training. The run's own window is decoded first and
    must give the run's recorded validation BLEU, n-gram precisions and length: the check that the study averages
    and searches as the run did. Chosen on validation only; test2016 is not decoded.

    Args:
        run: a finished run directory (its `reproduction.json`, `model.keras` and `checkpoints/`).
        windows: the K to try (the run's own `average_last` is added).
        checkpoints: a directory holding more of this run's checkpoints than the run kept (linked while it
            trained; a run that should keep them sets `keep_checkpoints`), laid out as a run directory:
            `checkpoints/` beside copies of the run's `config.json` and vocabulary, which averaging checks against
            the run's. The run's own checkpoints are used where both have a step. Default: the run's own only.
        json_path: where to write the rows with the command, machine and versions (default: nowhere).

    Returns:
        the rows, one per window, the run's own first: `window`, `steps` (of the checkpoints averaged),
        `val_tok_bleu` and `val_details`.

    Raises:
        SystemExit: a run whose final model is not an average of its last checkpoints (an EMA or an
            `average_fraction`), a window wider than the checkpoints up to the run's last update, or an own window
            that does not reproduce the run's score.
    """
    from keras_transformer.run_dir import load_run

    report = read_json(os.path.join(run, "reproduction.json"))
    own, found = _averaging_of(run, report), _checkpoints_up_to(run, report["step"], checkpoints)
    others = sorted(set(windows) - {own})  # the run's own may have averaged fewer than it names
    for window in others:
        if window > len(found):
            raise SystemExit(f"long_multi30k: {run} (with {checkpoints or 'no --checkpoints'}) holds {len(found)} "
                             f"checkpoints up to update {report['step']}, fewer than a window of {window}")  # fmt: skip
    model, tokenizer = load_run(run, dtype="float32")
    rows = []
    for window in [own] + others:
        steps, paths = zip(*found[-window:])
        score = _averaged_score(model, tokenizer, list(paths), run, text_form(report))
        rows.append(dict(window=window, steps=list(steps), val_tok_bleu=score["tok_bleu"],
                         val_details=score["tok_bleu_details"]))  # fmt: skip
        print(f"{run} last {window} ({steps[0]}-{steps[-1]}): {score['tok_bleu_details']}")
        if window == own and score["tok_bleu_details"] != report["val"]["tok_bleu_details"]:
            raise SystemExit(f"long_multi30k: {run}'s own window of {own} scores {score['tok_bleu_details']} here but "
                             f"{report['val']['tok_bleu_details']} in its report: the study does not average or "
                             "search as the run did")  # fmt: skip
    if json_path:
        command = f"python examples/long_multi30k.py --averaging-windows {run}"
        command += " --windows " + ",".join(str(w) for w in windows)
        command += f" --checkpoints {checkpoints}" if checkpoints else ""
        search = dict(beam=published.BEAM, alpha=published.ALPHA, length_penalty=published.LENGTH_PENALTY)
        _report(json_path, command, rows, run=run, trial=report.get("trial", "published"), seed=report["seed"],
                own_window=own, search=search)  # fmt: skip
    return rows


def _averaging_of(run, report):
    """The run's own window: its `average_last`, refused for final models that are not such an average."""
    training = report["training"]
    ema, fraction = training.get("ema"), training.get("average_fraction")
    if ema or fraction:
        raise SystemExit(f"long_multi30k: {run}'s final model is not the average of its last checkpoints "
                         f"(ema {ema}, average_fraction {fraction})")  # fmt: skip
    return max(1, training["average_last"])


def _checkpoints_up_to(run, last_step, extra=None):
    """`(step, path)` of the run's checkpoints up to `last_step`, oldest first, with those of `extra` at steps the
    run no longer holds."""
    from keras_transformer.run_dir import list_checkpoints
    from keras_transformer.training.averaging import check_same_model

    found = dict(list_checkpoints(run))
    if extra:
        more = dict(list_checkpoints(extra))
        if not more:
            raise SystemExit(f"long_multi30k: --checkpoints {extra} holds no checkpoints/ckpt-*.weights.h5")
        if found:  # `average_checkpoints` checks every path it averages; this refuses an unrelated one up front
            try:
                check_same_model([found[max(found)], more[max(more)]])
            except ValueError as error:
                raise SystemExit(f"long_multi30k: --checkpoints {extra}: {error}") from None
        found = {**more, **found}
    return sorted((step, path) for step, path in found.items() if step <= last_step)


def _averaged_score(model, tokenizer, paths, run, text):
    """`validation_score` of `model` with the mean of the checkpoints `paths` as its weights."""
    from keras_transformer.inference.translator import Translator
    from keras_transformer.training.averaging import average_checkpoints

    model.set_weights(average_checkpoints(paths, model))
    translator = Translator(
        model, tokenizer, beam_size=published.BEAM, alpha=published.ALPHA, length_penalty=published.LENGTH_PENALTY
    )
    return validation_score(translator, run, text)
