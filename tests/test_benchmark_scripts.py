"""Benchmark scripts' own logic (not their timings).

- `recipe_trials.py`: each trial is a valid demo command; the lower-cased trial's data; a new table keeps the
  rows of trials run elsewhere and their notes.
- `decode_throughput.py --tf-threads`: two positive integers, or a clear error.
- `decode_serving.py`: CTranslate2's GEMM libraries tried on each CPU vendor, TensorFlow's oneDNN kernels
  where they are not its default; each setting's fastest tuning pass decides.
- `translate_batching.py`: its candidates, and each one's ratios to the first batch size.
- `decode_matmul_bound.py`: each variant runs in a process of its own with its `XLA_FLAGS`, and is read against
  the plain bfloat16 graph of the same round.
- `decode_multi30k.py`: its results file records how it was made, as every benchmark's does.
- `common.py`: the results name the CPU by its model name, family and model number (`hardware.cpu_identity`),
  and a machine's default results folder is the one its kind of CPU already has.
"""

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import decode_matmul_bound  # noqa: E402
import decode_multi30k  # noqa: E402
import decode_serving  # noqa: E402
import decode_throughput  # noqa: E402
import recipe_trials  # noqa: E402


@pytest.fixture(scope="module")
def demo_parser():
    spec = importlib.util.spec_from_file_location("train_multi30k_for_tests", ROOT / "examples" / "train_multi30k.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser()


@pytest.mark.parametrize("name", sorted(recipe_trials.TRIALS))
def test_trial_command_is_a_demo_command(demo_parser, name):
    script, *argv = recipe_trials.trial_command(name)
    assert script == "examples/train_multi30k.py"
    args = demo_parser.parse_args(argv)  # an option the demo does not have exits here
    recipe = recipe_trials.TRIALS[name]
    assert args.config_dropout == recipe["dropout"] and args.average_last == recipe["average_last"]
    assert args.average_fraction == recipe["average_fraction"]  # None: the trials predate it
    assert args.eval_split == "val"  # trials never decode test2016
    if recipe.get("lowercase"):
        data_dir = pathlib.Path(recipe_trials.LOWERCASED_DIR).relative_to(ROOT)
        assert args.data == f"files:{data_dir}/{{split}}.{{src}},{data_dir}/{{split}}.{{tgt}}"
    else:
        assert args.data == "multi30k"


def test_lowercased_multi30k_is_the_shipped_data_lower_cased(tmp_path, monkeypatch):
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.data.spec import DataSpec

    monkeypatch.setattr(recipe_trials, "LOWERCASED_DIR", str(tmp_path))
    recipe_trials.lowercased_multi30k()
    for split in ("train", "val", "test2016"):
        for lang in ("en", "de"):
            written = (tmp_path / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")
            assert written[-1] == ""
            assert written[:-1] == [line.lower() for line in read_lines(split, lang)]
    # What the trial's --data names: the split and language placeholders lead to these files.
    spec = DataSpec.parse(f"files:{tmp_path}/{{split}}.{{src}},{tmp_path}/{{split}}.{{tgt}}")
    assert [path.format(split="val", src="en", tgt="de") for path in spec.paths] == [
        str(tmp_path / "val.en"),
        str(tmp_path / "val.de"),
    ]


def test_table_keeps_the_rows_of_trials_run_elsewhere(tmp_path, capsys):
    import json

    def row(name, steps, note=None):
        final = [dict(beam=4, alpha=0.6, bleu=30.0, tok_bleu=30.1, chrf=50.0, decode_seconds=1.0)]
        return dict(
            name=name,
            steps=steps,
            epochs=1.0,
            train_seconds=60.0,
            final_val_loss=3.0,
            variants=dict(final=final),
            tokens_per_sec_per_epoch=[1000],
            **({"note": note} if note else {}),
        )

    target = tmp_path / "recipe_trials.json"
    target.write_text(
        json.dumps(dict(trials=[row("earlier", 100, "from another machine"), row("rescored", 200, "kept note")]))
    )
    trials = tmp_path / "trials"
    (trials / "rescored").mkdir(parents=True)
    (trials / "rescored" / recipe_trials.SCORES_FILENAME).write_text(json.dumps(row("rescored", 250)))
    (trials / "new").mkdir()
    (trials / "new" / recipe_trials.SCORES_FILENAME).write_text(json.dumps(row("new", 300)))
    recipe_trials.main(["table", "--json", str(target), "--trials-dir", str(trials), "--note", "new=added"])
    rows = {r["name"]: r for r in json.loads(target.read_text())["trials"]}
    assert sorted(rows) == ["earlier", "new", "rescored"]
    assert rows["earlier"]["steps"] == 100 and rows["earlier"]["note"] == "from another machine"
    assert rows["rescored"]["steps"] == 250 and rows["rescored"]["note"] == "kept note"  # this machine's scores
    assert rows["new"]["note"] == "added"
    assert "| earlier |" in capsys.readouterr().out


def test_tf_threads_option():
    parser = argparse.ArgumentParser()
    assert decode_throughput._parse_tf_threads(parser, None) is None
    assert decode_throughput._parse_tf_threads(parser, "1,2") == (1, 2)
    for bad in ("1", "0,2", "1,x", "1,2,3", ""):
        with pytest.raises(SystemExit):
            decode_throughput._parse_tf_threads(parser, bad)


def test_ctranslate2_also_tries_mkl_on_cpus_where_it_is_not_its_default():
    intel = decode_serving.ct2_candidates("GenuineIntel")
    amd = decode_serving.ct2_candidates("AuthenticAMD")
    assert {candidate[3] for candidate in intel} == {"default"}  # MKL already
    assert {candidate[3] for candidate in amd} == {"default", "mkl"}
    assert sorted(amd) == sorted(intel + [(*candidate[:3], "mkl") for candidate in intel])


def test_savedmodel_also_tries_onednn_on_cpus_where_it_is_not_tensorflows_default():
    by_default = decode_serving.ours_candidates(onednn_by_default=True)
    elsewhere = decode_serving.ours_candidates(onednn_by_default=False)
    assert {candidate[4] for candidate in by_default} == {"default"}
    assert elsewhere == by_default + [(*candidate[:4], "onednn") for candidate in by_default]
    # The worker's arguments: every setting spelled out, TensorFlow's pools as "default".
    assert decode_serving._ours_args((250, 2, None, None, "onednn"), "/x") == [
        "savedmodel",
        "/x",
        250,
        2,
        "default",
        "default",
        "onednn",
    ]
    import serving_worker

    with pytest.raises(ValueError, match="kernels must be"):
        serving_worker.savedmodel_engine("/x", ["a"], 1, 1, kernels="mkl")
    with pytest.raises(ValueError, match="gemm must be 'default' or 'mkl', got 'onednn'"):
        serving_worker.ctranslate2_engine("/x", ["a"], 8, 1, 1, "int8", gemm="onednn")


def test_serving_requests_are_planned_as_translate_batches_and_answers_kept_in_file_order(tmp_path, upper_saved_model):
    """`--client translate` sends `even_batches` of the length order; the worker puts each answer in its row."""
    sentences = ["a", "bbbbb", "cc", "dddd", "eee", "ffffff"]  # longest first: rows 5, 1, 3, 4, 2, 0
    plan = decode_serving.request_plans(str(tmp_path), sentences)
    with open(plan(3, 2), encoding="utf-8") as f:
        assert json.load(f) == [[5, 3, 2], [1, 4, 0]]  # one round, dealt: each request gets long and short ones
    assert decode_serving._ours_args((3, 2, 1, 2, "default"), "/x", plan)[2] == str(tmp_path / "requests_3x2.json")
    assert decode_serving.request_plans(str(tmp_path), sentences, "file")(3, 2) == 3
    with pytest.raises(ValueError, match="client must be"):
        decode_serving.request_plans(str(tmp_path), sentences, "sorted")

    import serving_worker

    for requests in (plan(3, 2), "4"):  # a plan, and 4 per request in file order
        translate = serving_worker.savedmodel_engine(upper_saved_model, sentences, requests, 2)
        assert translate() == [s.upper() for s in sentences]
    (tmp_path / "short.json").write_text("[[0, 1], [2, 3]]")
    with pytest.raises(ValueError, match="each of the 6 sentences' rows once"):
        serving_worker.savedmodel_engine(upper_saved_model, sentences, str(tmp_path / "short.json"), 2)


def test_serving_tuning_keeps_each_setting_s_fastest_pass(monkeypatch):
    """One slow pass of a setting (a neighbour's burst on a shared machine) must not decide the best setting."""
    passes = {"a": iter([3.4, 3.0]), "b": iter([3.2, 3.3])}

    class FakeWorker:
        def __init__(self, args, sentences_file):
            self.setting = args[0]

        def command(self, word):
            assert word == "run"
            return {"seconds": next(passes[self.setting])}

        def close(self):
            pass

    monkeypatch.setattr(decode_serving, "Worker", FakeWorker)
    best, seconds = decode_serving.best_setting("ours", ["a", "b"], lambda c: [c], "sources.en", passes=2)
    assert (best, seconds) == ("a", {"a": 3.0, "b": 3.2})
    with pytest.raises(SystemExit):
        decode_serving.main(["RUN", "--tuning-passes", "0"])


def test_translate_batching_compares_each_batch_size_with_the_first():
    import translate_batching

    assert translate_batching.candidates([64, 256], onednn_by_default=True) == [
        (64, "default", "cli"),
        (256, "default", "cli"),
    ]
    assert translate_batching.candidates([64, 256], onednn_by_default=False) == [
        (64, "default", "cli"),
        (256, "default", "cli"),
        (64, "onednn", "cli"),
        (256, "onednn", "cli"),
    ]
    assert translate_batching.candidates([256], onednn_by_default=True, threads=("default", "cli")) == [
        (256, "default", "default"),
        (256, "default", "cli"),
    ]
    assert translate_batching.label((256, "default", "default")) == (
        "batch_size 256, default kernels, TensorFlow's default thread pools"
    )
    base, big = (64, "default", "cli"), (256, "default", "cli")
    times = {
        base: [{"cold": 10.0, "warm": 8.0}, {"cold": 12.0, "warm": 8.0}],
        big: [{"cold": 5.0, "warm": 8.0}, {"cold": 8.0, "warm": 4.0}],
    }
    results = translate_batching.summarize(times, {base: ["a", "b"], big: ["a", "c"]}, base, 2)
    assert results["batch_size 256, default kernels"]["cold"]["median_ratio_to_baseline"] == pytest.approx(1.75)
    assert results["batch_size 256, default kernels"]["warm"]["median_ratio_to_baseline"] == pytest.approx(1.5)
    assert results["batch_size 256, default kernels"]["identical_to_baseline"] == 0.5
    assert results["batch_size 64, default kernels"]["warm"]["sentences_per_second"] == pytest.approx(0.25)
    import serving_worker

    with pytest.raises(ValueError, match="kernels must be"):
        serving_worker.translator_engine("/x", ["a"], 1, 1, kernels="mkl")
    with pytest.raises(ValueError, match="threads must be"):
        serving_worker.translator_engine("/x", ["a"], 1, 1, threads="two")


def test_results_command_shows_the_kernel_variables_that_were_set():
    import common

    argv = [str(ROOT / "benchmarks" / "profile_serving.py"), "a=/tmp/x y", "--rounds", "3"]
    assert (
        common.command_line(argv, {"HOME": "/root"}) == "python benchmarks/profile_serving.py 'a=/tmp/x y' --rounds 3"
    )
    assert common.command_line(argv, {"TF_ENABLE_ONEDNN_OPTS": "1", "CT2_USE_MKL": "1"}) == (
        "TF_ENABLE_ONEDNN_OPTS=1 CT2_USE_MKL=1 python benchmarks/profile_serving.py 'a=/tmp/x y' --rounds 3"
    )


def test_results_name_the_cpu_by_its_family_and_model():
    import common

    from keras_transformer.hardware import cpu_identity

    info = common.machine_info()
    assert {key: info[key] for key in cpu_identity()} == cpu_identity()


@pytest.mark.parametrize(
    "vendor, model_name, family, flags, folder",
    [
        ("GenuineIntel", "Intel(R) Xeon(R) Processor", 6, "avx2 avx512f avx512_bf16 amx_bf16", "avx512_bf16"),
        ("GenuineIntel", "Intel(R) Xeon(R) Processor", 6, "avx2 avx512f", "avx2"),
        ("AuthenticAMD", "AMD EPYC", 26, "avx2 avx512f avx512_bf16", "amd_epyc_zen5"),
        ("AuthenticAMD", "AMD EPYC", 25, "avx2 avx512f avx512_bf16", "amd_epyc_avx512_bf16"),
        ("AuthenticAMD", "AMD EPYC 7B13", 25, "avx2", "amd_epyc_avx2"),
        ("AuthenticAMD", "AMD Ryzen 9 9950X", 26, "avx2 avx512_bf16", "amd_zen5"),
    ],
)
def test_results_folder_is_the_one_of_the_cpus_kind(tmp_path, vendor, model_name, family, flags, folder):
    import common

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: 2\n"
        f"model name\t: {model_name}\nflags\t\t: fpu sse2 {flags}\n\n"
    )
    assert common.results_folder(str(cpuinfo)) == folder
    # The folders the committed results use exist for the kinds measured so far.
    if model_name in ("Intel(R) Xeon(R) Processor", "AMD EPYC") and "avx512_bf16" in flags:
        assert (ROOT / "benchmarks" / "results" / folder).is_dir()


def test_results_folder_without_cpuinfo_is_avx2(tmp_path):
    import common

    assert common.results_folder(str(tmp_path / "missing")) == "avx2"


def test_matmul_bound_runs_each_variant_in_a_process_with_its_xla_flags(tmp_path, monkeypatch):
    calls = []
    real_run = subprocess.run

    def fake_run(command, env=None, capture_output=False, text=False, **kwargs):
        if "--worker" not in command:  # git, for the results file's commit
            return real_run(command, env=env, capture_output=capture_output, text=text, **kwargs)
        variant = command[command.index("--worker") + 1]
        calls.append((variant, env["XLA_FLAGS"], command))
        ms = {"graph bfloat16": 2.0, "graph float32": 4.0}.get(variant, 8.0 if "float32" in variant else 5.0)
        hlo = "null" if variant.startswith("graph") else '{"dots": 19, "library_fusions": {}}'
        stdout = f'noise\n{{"ms_per_step": {ms + len(calls) * 1e-3}, "hlo": {hlo}}}\n'
        return subprocess.CompletedProcess(command, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")  # the user's own flags are kept
    out = tmp_path / "bound.json"
    decode_matmul_bound.main(["--only", "graph,XLA oneDNN fusion", "--rounds", "2", "--json", str(out)])
    names = ["graph float32", "graph bfloat16", "XLA oneDNN fusion float32", "XLA oneDNN fusion bfloat16"]
    assert [variant for variant, _, _ in calls] == names * 2  # rounds alternate between the variants
    flags = {variant: xla_flags for variant, xla_flags, _ in calls}
    assert flags["graph bfloat16"] == "--xla_dump_to=/tmp/x"
    assert flags["XLA oneDNN fusion float32"] == "--xla_dump_to=/tmp/x --xla_cpu_experimental_onednn_fusion_type=dot"
    assert all("--json" not in command for _, _, command in calls)  # workers write no results file
    results = {r["variant"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == names
    assert results["graph bfloat16"]["speed_vs_graph_bfloat16"] == 1.0
    assert results["graph float32"]["speed_vs_graph_bfloat16"] == pytest.approx(0.5, abs=2e-3)
    assert results["XLA oneDNN fusion bfloat16"]["xla"] is True
    assert results["XLA oneDNN fusion bfloat16"]["hlo"] == {"dots": 19, "library_fusions": {}}
    assert results["graph bfloat16"]["hlo"] is None
    assert results["graph float32"]["gflops"] == pytest.approx(
        decode_matmul_bound.step_flops(128, 3, 256, 1024, 8000) / 4.0 / 1e6, rel=1e-3
    )


def test_matmul_bound_worker_times_a_step(monkeypatch):
    args = argparse.Namespace(sentences=2, beam_size=2, layers=1, d_model=8, d_ff=16, vocab_size=32, steps=2, repeats=2)
    for dtype in decode_matmul_bound.DTYPES:
        ms, hlo = decode_matmul_bound.time_step(dtype, False, args)
        assert 0 < ms < 1000 and hlo is None
    ms, hlo = decode_matmul_bound.time_step("bfloat16", True, args)
    assert 0 < ms < 1000
    assert hlo["dots"] == 7  # 6 per layer and the output projection, unless a library fusion took them


def test_hlo_summary_counts_dots_and_library_fusions():
    hlo = """
  %dot.1 = bf16[128,768]{1,0} dot(bf16[128,256]{1,0} %p0, bf16[256,768]{1,0} %p1)
  %fusion.2 = bf16[128,256]{1,0} fusion(%a, %b), kind=kCustom, calls=%__ynn_fusion.3
  %fusion.3 = bf16[128,256]{1,0} fusion(%a, %b), kind=kCustom, calls=%__ynn_fusion.4
  %cc = f32[2] custom-call(%x), custom_call_target="__onednn$matmul"
"""
    assert decode_matmul_bound.hlo_summary(hlo) == {
        "dots": 1,
        "library_fusions": {"__onednn$matmul": 1, "__ynn_fusion": 2},
    }


def test_matmul_bound_failing_worker_says_which_variant(monkeypatch):
    monkeypatch.setattr(
        subprocess,
        "run",
        lambda command, **kwargs: subprocess.CompletedProcess(
            command, 1, stdout="", stderr="Unknown flag --xla_cpu_foo"
        ),
    )
    with pytest.raises(RuntimeError, match="XLA bfloat16 failed .exit 1.:\n.*Unknown flag"):
        decode_matmul_bound.run_variant("XLA bfloat16", [])


def test_rounds_rotate_which_system_runs_first():
    """A B C, then B C A, then C A B: no system always runs first or always follows the same one."""
    import common

    calls = []

    def system(name):
        return common.System(name, lambda: lambda: calls.append(name) or {"sentences": 1.0})

    results = common.run_alternating([system("A"), system("B"), system("C")], repeats=4)
    assert calls == list("ABCBCACABABC")
    assert [len(r.seconds) for r in results] == [4, 4, 4] and [r.name for r in results] == ["A", "B", "C"]


def test_results_record_the_commit_they_measured(tmp_path):
    import common

    assert common.code_version(str(tmp_path)) is None  # not a git checkout

    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit = git("rev-parse", "HEAD").stdout.strip()
    (tmp_path / "untracked.txt").write_text("not code\n")
    assert common.code_version(str(tmp_path)) == commit
    (tmp_path / "a.py").write_text("x = 2\n")
    assert common.code_version(str(tmp_path)) == commit + "+dirty"
    assert common.provenance()["commit"] == common.code_version()


def test_decode_multi30k_writes_a_results_file_with_its_provenance(tiny_run_dir, tmp_path):
    out = tmp_path / "decode_multi30k.json"
    decode_multi30k.main(
        [tiny_run_dir, "--sentences", "2", "--batch-size", "2", "--modes", "cached", "--json", str(out)]
    )
    written = json.loads(out.read_text())
    assert {"command", "commit", "cpu_flags", "date", "machine", "versions"} <= set(written)
    assert written["benchmark"] == "decode_multi30k" and written["run_dir"] == tiny_run_dir
    assert [(row["mode"], row["sentences"]) for row in written["results"]] == [("cached", 2)]
