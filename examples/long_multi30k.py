"""Our long recipe for Multi30k en-de: beat the published Transformer-tiny, choosing on validation only.

`examples/reproduce_multi30k.py` trains the published recipe (Wu et al., 2021: 41.02 lower-cased tokenized BLEU
on test2016). This script tries changes to it that the library offers, within two hours of training per run on
two CPU cores, and judges them on the validation split alone:

- a trial (`--trial NAME --seed N`) trains one seed of an entry of `TRIALS` (in `long_trials.py`); test2016 is
  never decoded for it;
- `--table` collects every trial's report into the trials table (options, updates, epochs, validation BLEU and
  loss, training time, machine), rewritten from the run directories each time; with `--json`, the rows of runs
  whose directories are gone are carried over from the file it rewrites, marked as such;
- the chosen recipe (`CHOSEN` in `long_trials.py`, picked from the table by validation BLEU) runs like the
  reproduction (`--seed N`): validation, then test2016 scored once, a SavedModel export with the recipe's search, and
  `--summarize` for the mean and standard deviation over three seeds;
- `--commit RUN_DIR` makes a finished trial run of raw text (the one best on validation) the committed model:
  test2016 scored once, exported over `saved_models/multi30k_en_de/1` with its recipe, seed, machine and scores.

Everything else is the reproduction's: the same lower-cased Moses-tokenized data (unless a trial trains on the
corpus as written, `text="raw"`), the same checkpoint per epoch and average of the last 10, fairseq's search
(beam 5, log P / length), the same scoring.

Run:
    python examples/long_multi30k.py --trial bpe_dropout_12k --seed 0       # one trial, ~1.5 h on 2 cores
    python examples/long_multi30k.py --trial mini_15k_cooldown --seed 0 --start-from runs/long/mini_12k_seed0
    python examples/long_multi30k.py --table runs/long runs/reproduce \\
        --json benchmarks/results/<cpu>/long_recipe_trials.json
    python examples/long_multi30k.py --seed 0 --output runs/long/seed0         # the chosen recipe
    python examples/long_multi30k.py --summarize runs/long/seed0 runs/long/seed1 runs/long/seed2 \\
        --json benchmarks/results/<cpu>/long_multi30k.json --plot benchmarks/results/<cpu>/long_multi30k.png
    python examples/long_multi30k.py --ensembles runs/long/mini_12k_seed0,runs/long/mini_12k_seed1 \\
        --json benchmarks/results/<cpu>/long_ensembles.json                   # what ensembles would gain
    python examples/long_multi30k.py --length-penalties runs/long/mini_12k_seed0 runs/long/mini_12k_seed1 \\
        --alphas 1.0,1.2,1.4 --json benchmarks/results/<cpu>/long_length_penalties.json  # the search's lever
    python examples/long_multi30k.py --averaging-windows runs/long/mini_12k_seed0 --windows 5,10,20,40 \\
        --checkpoints runs/long/mini_12k_seed0_kept \\
        --json benchmarks/results/<cpu>/long_averaging_windows.json             # the averaging's lever
    python examples/long_multi30k.py --commit runs/long/raw_12k_seed0 \\
        --json benchmarks/results/<cpu>/committed_model.json                   # the committed model
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import reproduce_multi30k as published  # noqa: E402
from long_searches import averaging_windows, ensembles, length_penalties  # noqa: E402
from long_searches import read_json as _read  # noqa: E402
from long_searches import recipe_of as _recipe_of  # noqa: E402
from long_trials import CHOSEN, STOPPED, TRIALS  # noqa: E402
from reproduce_multi30k import write_json as _write  # noqa: E402


def trial_recipe(name):
    """The published recipe with trial `name`'s changes."""
    if name not in TRIALS:
        raise SystemExit(f"long_multi30k: unknown trial {name!r}; expected one of {', '.join(TRIALS)}")
    return dict(published.RECIPE, **TRIALS[name][0])


def run_trial(name, seed, output, limit=None, from_run=None):
    """Trains (or resumes) one seed of one trial and scores the validation split only.

    `from_run`: a finished run of the same seed to continue (`start_from`) instead of starting afresh.
    """
    command = f"python examples/long_multi30k.py --trial {name} --seed {seed} --output {output}"
    if from_run:
        command += f" --start-from {from_run}"
    trial_path = os.path.join(output, "trial.json")
    if from_run and not os.path.exists(trial_path):
        start_from(from_run, name, seed, output, command)
    os.makedirs(output, exist_ok=True)
    if not os.path.exists(trial_path):  # names the run even if it never finishes
        _write(trial_path, dict(trial=name, seed=seed, command=command))
    return published.run(
        seed,
        output,
        export=False,
        limit=limit,
        recipe=trial_recipe(name),
        splits=("val",),
        command=command,
        extra=dict(trial=name, **_started(_read(trial_path))),
    )


# Options a trial may change and still start from a finished run's state (`start_from`): its later updates only.
PREFIX_OPTIONS = ("max_steps", "cooldown")


def start_from(run_dir, name, seed, output, command):
    """Copies the finished run `run_dir` into `output` so that trial `name` resumes from its last state.

    A run is its seed's: a trial whose recipe differs from the run's only after the run's last update (more
    updates; a cooldown that starts later) continues that run as a fresh run of the trial would continue had it
    been interrupted there (a resume draws new dropout masks, seeded by the step). Refuses any other difference.
    The copy's `config.json` names its own data files and the trial's cooldown (fixed for a resume, and 1 for
    every update the copy holds); its `trial.json` records the run it started from. The copy is made beside
    `output` and renamed: it is whole or absent.
    """
    import shutil

    if os.path.exists(output):
        raise SystemExit(f"long_multi30k: {output} exists and is not a trial's run; --start-from makes a new one")
    source = _read(os.path.join(run_dir, "reproduction.json"))
    trained = _recipe_of(source)
    step = _read(os.path.join(run_dir, "backup", "state.json"))["step"]
    recipe = trial_recipe(name)
    # A run that cooled down has spent its schedule: more updates or another cooldown change its rate before its end.
    later_only = () if trained.get("cooldown") else PREFIX_OPTIONS
    differences = _recipe_differences(trained, recipe, allowed=later_only)
    cooldown = recipe.get("cooldown", 0.0)
    if source["seed"] != seed:
        differences.append(f"seed ({source['seed']} -> {seed})")
    if (1.0 - cooldown) * recipe["max_steps"] < step:
        differences.append(f"the rate before update {step} (max_steps {recipe['max_steps']}, cooldown {cooldown})")
    if differences:
        raise SystemExit(f"long_multi30k: trial {name} cannot start from {run_dir}: {'; '.join(differences)}")
    partial = output.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(
        run_dir, partial, ignore=shutil.ignore_patterns("reproduction.json", "trial.json", "*.hyp.*", "export")
    )
    config = _read(os.path.join(partial, "config.json"))
    config["data"]["spec"] = config["training"]["data"] = published.data_spec(output)
    config["training"]["cooldown"] = cooldown
    _write(os.path.join(partial, "config.json"), config)
    trial = dict(trial=name, seed=seed, command=command, started_from=os.path.abspath(run_dir), started_at=step)
    _write(os.path.join(partial, "trial.json"), trial)
    os.replace(partial, output)


def _started(trial):
    """The run a trial's `trial.json` says it started from (`start_from`), as report fields; {} for a fresh run."""
    return {key: value for key, value in trial.items() if key.startswith("started_")}


def run_chosen(seed, output, limit=None):
    """One seed of the chosen recipe: validation, test2016 once, and the export.

    `output` may hold the chosen trial's run of this seed: it is finished (or resumed), then scored and exported.
    """
    if CHOSEN is None:
        raise SystemExit("long_multi30k: no recipe chosen yet; run trials (--trial) and read --table first")
    command = f"python examples/long_multi30k.py --seed {seed} --output {output}"
    trial_path, start = os.path.join(output, "trial.json"), {}
    if os.path.exists(trial_path):
        trial = _read(trial_path)
        if (trial["trial"], trial["seed"]) != (CHOSEN, seed):
            raise SystemExit(
                f"long_multi30k: {output} holds seed {trial['seed']} of trial {trial['trial']}, not seed {seed} "
                f"of the chosen {CHOSEN}"
            )
        start = _started(trial)
    return published.run(
        seed, output, limit=limit, recipe=trial_recipe(CHOSEN), command=command, extra=dict(trial=CHOSEN, **start)
    )


# Where `--commit` writes the committed model: TF Serving's base directory, and the version it replaces.
COMMITTED_MODEL, COMMITTED_VERSION = "saved_models/multi30k_en_de", 1


def commit(run_dir, base=COMMITTED_MODEL, limit=None, json_path=None):
    """Makes the finished trial run `run_dir` the committed model; returns the version directory written.

    The committed model is chosen on validation among runs of raw text (`text="raw"`): TF Serving clients send
    sentences as written and read German as written, which a model of lower-cased tokenized text does not give.
    The run is scored on validation and test2016 (once per commit: test2016 chooses nothing here) and exported
    with its search into `run_dir/export` (`published.run`); that export is then written again over
    `base/<COMMITTED_VERSION>`, replacing the version there (written beside it and renamed). Its `export.json`
    records the trial, the recipe, the seed, the machine and both scores; `json_path`, if given, receives the
    run's report as a results file. Everything that can be refused is refused before anything is decoded.
    """
    from keras_transformer.inference.export_dirs import check_replaceable
    from keras_transformer.inference.saved_model import export_saved_model

    paths = [os.path.join(run_dir, name) for name in ("trial.json", "reproduction.json")]
    if not all(os.path.exists(path) for path in paths):
        raise SystemExit(f"long_multi30k: {run_dir} holds no finished trial (its trial.json and reproduction.json)")
    trial, recorded = _read(paths[0]), _read(paths[1])
    recipe = trial_recipe(trial["trial"])
    if recipe["text"] != "raw":
        raise SystemExit(
            f"long_multi30k: {run_dir} is trial {trial['trial']}, which reads {published.TEXT_FORMS[recipe['text']]}; "
            f"the committed model reads {published.TEXT_FORMS['raw']}"
        )
    changed = _recipe_differences(_recipe_of(recorded), recipe)
    if changed:
        raise SystemExit(
            f"long_multi30k: {run_dir} was trained before trial {trial['trial']} changed: {'; '.join(changed)}"
        )
    check_replaceable(os.path.join(base, str(COMMITTED_VERSION)))
    command = f"python examples/long_multi30k.py --commit {run_dir}"
    if os.fspath(base) != COMMITTED_MODEL:
        command += f" --output {base}"
    if limit:
        command += f" --limit {limit}"
    if json_path:
        command += f" --json {json_path}"
    report = published.run(
        trial["seed"],
        run_dir,
        limit=limit,
        recipe=recipe,
        command=command,
        extra=dict(trial=trial["trial"], trial_command=trial["command"], **_started(trial)),
    )
    path = export_saved_model(report["export_path"], base, version=COMMITTED_VERSION, overwrite=True)
    if json_path:
        _write(json_path, dict(report, committed_as=os.fspath(path)))
    print(f"committed {run_dir} (trial {trial['trial']}, seed {trial['seed']}) as {path}")
    return path


def trial_rows(roots):
    """One row per trial run under the directories `roots` (any depth), sorted by trial and seed.

    A finished run gives its report; a run that has not finished (or was stopped, `STOPPED`) its last epoch's
    validation loss from `history.csv`, with no BLEU. A run of `reproduce_multi30k.py`'s published recipe is a
    row of the "published" trial.
    """
    rows = []
    walks = [(directory, files) for root in roots for directory, _, files in os.walk(root)]
    for directory, files in walks:
        if "reproduction.json" in files:
            row = _finished_row(_read(os.path.join(directory, "reproduction.json")))
        elif "trial.json" in files:
            row = _unfinished_row(directory, _read(os.path.join(directory, "trial.json")))
        else:
            continue
        if row:
            rows.append(row)
    return sorted(rows, key=_run_key)


def _run_key(row):
    """A trials-table row's run: its trial and seed, the order of the table."""
    return row["trial"], row["seed"]


def _recipe_differences(trained, recipe, allowed=()):
    """Each option, outside `allowed`, whose value in `recipe` differs from the `trained` one, as "key (a -> b)"."""
    keys = sorted(key for key in set(recipe) | set(trained) if key not in allowed)
    return [
        f"{key} ({trained.get(key)!r} -> {recipe.get(key)!r})" for key in keys if trained.get(key) != recipe.get(key)
    ]


def _changes(recipe):
    """The options in which `recipe` (every option, as `_recipe_of` or `trial_recipe` gives) differs from the
    published recipe."""
    return {key: value for key, value in recipe.items() if published.RECIPE.get(key) != value}


def _finished_row(report):
    changes = _changes(_recipe_of(report))
    trial = report.get("trial") or ("published" if not changes else None)
    if trial is None:
        return None
    return dict(
        trial=trial,
        seed=report["seed"],
        status="finished",
        changes=changes,
        updates=report["step"],
        epochs=report["epochs"],
        val_tok_bleu=report["val"]["tok_bleu"],
        val_details=report["val"]["tok_bleu_details"],
        val_loss=round((report["val_metrics"] or {}).get("loss", float("nan")), 4),
        train_hours=round((report["train_seconds"] or 0) / 3600, 2),
        machine=report["machine"],
        command=report.get("trial_command") or report["command"],
        date=report["date"],
    )


def _unfinished_row(directory, trial):
    from keras_transformer.run_dir import read_csv

    history = [row for row in read_csv(os.path.join(directory, "history.csv")) if row.get("val_loss")]
    if not history:
        return None
    last = history[-1]
    config = _read(os.path.join(directory, "config.json"))
    return dict(
        trial=trial["trial"],
        seed=trial["seed"],
        status="stopped: " + STOPPED[trial["trial"]] if trial["trial"] in STOPPED else "running",
        changes=_changes(trial_recipe(trial["trial"])),
        updates=int(float(last["step"])),
        epochs=round(float(last["step"]) / config["data"]["steps_per_epoch"], 2),
        val_tok_bleu=None,
        val_loss=round(float(last["val_loss"]), 4),
        train_hours=round(published._trained_seconds(directory) / 3600, 2),
        command=trial["command"],
    )


def table(roots, json_path=None):
    """Rewrites the trials table from the run directories under `roots`; prints it as Markdown.

    With `json_path`, the table is also written there, and a row of the table it replaces whose run (trial and
    seed) is not under `roots` is kept, with `carried_over` set: a run directory deleted to free the disk does
    not delete its result.
    """
    rows = trial_rows(roots)
    if json_path and os.path.exists(json_path):
        found = {_run_key(row) for row in rows}
        kept = [dict(row, carried_over=True) for row in _read(json_path)["rows"] if _run_key(row) not in found]
        rows = sorted(rows + kept, key=_run_key)
    lines = ["| trial | seed | changes | updates | epochs | val BLEU | val loss | train h | status |", "|" + "---|" * 9]
    for row in rows:
        changes = ", ".join(f"{key}={value}" for key, value in row["changes"].items()) or "none"
        bleu = "" if row["val_tok_bleu"] is None else f"{row['val_tok_bleu']:.2f}"
        lines.append(
            f"| {row['trial']} | {row['seed']} | {changes} | {row['updates']} | {row['epochs']} | "
            f"{bleu} | {row['val_loss']:.4f} | {row['train_hours']:.2f} | {row['status']}"
            f"{' (carried over)' if row.get('carried_over') else ''} |"
        )
    print("\n".join(lines))
    if json_path:
        command = f"python examples/long_multi30k.py --table {' '.join(roots)} --json {json_path}"
        _write(json_path, dict(command=command, date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                               versions=published.versions(), machine=published.machine(),
                               trials={name: why for name, (_, why) in TRIALS.items()}, chosen=CHOSEN,
                               rows=rows))  # fmt: skip
    return rows


DEFAULT_ALPHAS = "1.0,1.2,1.4,1.6"
DEFAULT_WINDOWS = "5,10,20,40"


def _alphas(parser, text):
    """`--alphas` as floats, each one the searches accept, or the parser's one-line error."""
    from keras_transformer.decoding.defaults import check_alpha
    from keras_transformer.errors import ParameterError

    try:
        return [check_alpha(alpha) for alpha in text.split(",")]
    except ParameterError as error:
        parser.error(f"--alphas {text}: {error}")


def _windows(parser, text):
    """`--windows` as checkpoint counts of at least 1, or the parser's one-line error."""
    try:
        windows = [int(window) for window in text.split(",")]
    except ValueError:
        windows = [0]
    if min(windows) < 1:
        parser.error(f"--windows {text}: give comma-separated checkpoint counts of at least 1")
    return windows


def _parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trial", choices=sorted(TRIALS), help="train one trial, scored on validation only")
    parser.add_argument("--seed", type=int, help="seed of weights, dropout and data order (default 0)")
    parser.add_argument(
        "--output",
        help=f"run directory (default runs/long/TRIAL_seedN, or runs/long/seedN); with --commit, the model's base "
        f"directory (default {COMMITTED_MODEL})",
    )
    parser.add_argument("--limit", type=int, help="only the first N pairs of each split (a smoke test)")
    parser.add_argument(
        "--start-from", metavar="RUN_DIR", help="with --trial: continue this finished run of the same seed"
    )
    parser.add_argument(
        "--table", nargs="+", metavar="ROOT", help="print (and with --json write) the trials under each ROOT"
    )
    parser.add_argument("--summarize", nargs="+", metavar="RUN_DIR", help="summarize the chosen recipe's seeds")
    parser.add_argument(
        "--commit",
        metavar="RUN_DIR",
        help=f"score this finished trial run on test2016 and export it over version {COMMITTED_VERSION} of --output "
        f"(default {COMMITTED_MODEL})",
    )
    parser.add_argument(
        "--ensembles",
        nargs="+",
        metavar="RUN,RUN[,...]",
        help="validation BLEU of each group of finished runs ensembled, against its members (no test2016)",
    )
    parser.add_argument(
        "--length-penalties",
        nargs="+",
        metavar="RUN",
        help="validation BLEU of each finished run searched with each of --alphas (no test2016)",
    )
    parser.add_argument(
        "--alphas",
        help=f"with --length-penalties: comma-separated exponents of the length (default {DEFAULT_ALPHAS})",
    )
    parser.add_argument(
        "--averaging-windows",
        metavar="RUN",
        help="validation BLEU of this finished run with each of --windows checkpoints averaged (no test2016)",
    )
    parser.add_argument(
        "--windows", help=f"with --averaging-windows: comma-separated checkpoint counts (default {DEFAULT_WINDOWS})"
    )
    parser.add_argument(
        "--checkpoints",
        metavar="DIR",
        help="with --averaging-windows: more of the run's checkpoints, kept in DIR/checkpoints beside copies of its "
        "config.json and vocabulary (default: the run's own only)",
    )
    parser.add_argument("--json", help="with any task but --trial or the chosen recipe: write the result here")
    parser.add_argument("--plot", help="with --summarize: the runs' validation curves (PNG)")
    return parser


def main(argv=None):
    parser = _parser()
    namespace = parser.parse_args(argv)
    if namespace.commit and namespace.limit and not namespace.output:
        parser.error("--commit with --limit scores a few sentences: give --output, not the committed model's directory")
    for flag in ("trial", "seed", "plot", "start_from"):
        if namespace.commit and getattr(namespace, flag) is not None:
            parser.error(
                f"--commit takes the run's own trial and seed and plots nothing: drop --{flag.replace('_', '-')}"
            )
    flags = ("table", "ensembles", "length_penalties", "averaging_windows", "commit", "summarize", "trial")
    tasks = [f"--{flag.replace('_', '-')}" for flag in flags if getattr(namespace, flag)]
    if len(tasks) > 1:
        parser.error(f"{', '.join(tasks)} are separate tasks: give one of them")
    if namespace.alphas and not namespace.length_penalties:
        parser.error("--alphas goes with --length-penalties")
    if (namespace.windows or namespace.checkpoints) and not namespace.averaging_windows:
        parser.error("--windows and --checkpoints go with --averaging-windows")
    namespace.seed = namespace.seed or 0
    if namespace.start_from and not namespace.trial:
        parser.error("--start-from continues a run as a trial: give --trial NAME too")
    if namespace.table:
        table(namespace.table, namespace.json)
    elif namespace.ensembles:
        ensembles([group.split(",") for group in namespace.ensembles], namespace.json)
    elif namespace.length_penalties:
        alphas = _alphas(parser, namespace.alphas or DEFAULT_ALPHAS)
        length_penalties(namespace.length_penalties, alphas, namespace.json)
    elif namespace.averaging_windows:
        windows = _windows(parser, namespace.windows or DEFAULT_WINDOWS)
        averaging_windows(namespace.averaging_windows, windows, namespace.checkpoints, namespace.json)
    elif namespace.commit:
        commit(namespace.commit, namespace.output or COMMITTED_MODEL, namespace.limit, namespace.json)
    elif namespace.summarize:
        published.summarize(namespace.summarize, namespace.json, namespace.plot, script="examples/long_multi30k.py")
    elif namespace.trial:
        output = namespace.output or f"runs/long/{namespace.trial}_seed{namespace.seed}"
        run_trial(namespace.trial, namespace.seed, output, namespace.limit, namespace.start_from)
    else:
        run_chosen(namespace.seed, namespace.output or f"runs/long/seed{namespace.seed}", namespace.limit)
    return 0


if __name__ == "__main__":
    from keras_transformer.cli import run_script

    run_script(main, "long_multi30k.py")
