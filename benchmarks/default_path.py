"""What new options cost when unused: the default export of two versions of the code, side by side.

Options such as n-gram blocking (`--no-repeat-ngram-size`) and the input byte
bound of 0.3.0 must leave the default decoding as it was, in answers and in
speed. This exports the same model with the code of a git revision (`--old`,
checked out into a temporary worktree) and with the current checkout, each
in its own process and with the default decoding options in `--precision`
(a run directory's: beam 4, alpha 0.6, §6.1; an exported version keeps the
search it recorded), then loads both SavedModels in this process
(`SavedModelTranslator`, as `translate --model` does) and translates
Multi30k test2016 with each, in alternated rounds (`common.run_alternating`;
medians, and the median of paired ratios new/old). It reports whether the
translations are identical, sentence by sentence.

Usage:
    .venv/bin/python benchmarks/default_path.py saved_models/multi30k_en_de/1 --old 21977a1 \\
        --json benchmarks/results/amd_epyc_zen5/default_path.json
    .venv/bin/python benchmarks/default_path.py runs/multi30k_en_de --old HEAD~5 --sentences 50 --repeats 1
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

# Run by each revision's own Python path: its export function, its defaults, float32 or bfloat16.
EXPORT_SCRIPT = """
import json, sys
from keras_transformer.inference.saved_model import export_saved_model
path = export_saved_model(sys.argv[1], sys.argv[2], dtype=sys.argv[3], warmup_sentences=None)
print(json.dumps({"path": path}))
"""


def export_with(code_root, source, output, precision):
    """Exports `source` with the package found in `code_root`, in a fresh process; the version directory."""
    env = dict(os.environ, PYTHONPATH=code_root, TF_CPP_MIN_LOG_LEVEL="3")
    command = [sys.executable, "-c", EXPORT_SCRIPT, os.path.abspath(source), output, precision]
    return common.json_from_process(command, f"export with {code_root}", env=env)["path"]


def worktree_at(revision, directory):
    """A detached git worktree of this repository at `revision`, in `directory`."""
    subprocess.run(
        ["git", "-C", common.ROOT, "worktree", "add", "--detach", directory, revision],
        check=True,
        capture_output=True,
        text=True,
    )
    return subprocess.run(
        ["git", "-C", directory, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()


def system(name, export_dir, sources, batch_size, outputs, baseline=None):
    """A `common.System` translating `sources` with the SavedModel `export_dir`; its last translations kept."""
    from keras_transformer.inference.translator import SavedModelTranslator

    def setup():
        translator = SavedModelTranslator(export_dir)
        translator.translate(sources[:batch_size], batch_size=batch_size)  # traces and loads the kernels

        def run():
            outputs[name] = translator.translate(sources, batch_size=batch_size)
            return {"sentences": len(sources)}

        return run

    return common.System(name, setup, baseline=baseline, info={"export": export_dir})


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", help="a run directory or an exported version to export again")
    parser.add_argument("--old", required=True, help="git revision of the code to compare with (e.g. 21977a1)")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--sentences", type=int, default=None, help="the first N of test2016 (default: all 1,000)")
    parser.add_argument("--repeats", type=int, default=5, help="alternated rounds (default 5)")
    parser.add_argument("--batch-size", type=int, default=None, help="sentences per request (default: translate's)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)

    from keras_transformer.data.corpora import read_lines
    from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE

    sources = read_lines("test2016", "en")[: args.sentences]
    batch_size = args.batch_size or DEFAULT_TRANSLATE_BATCH_SIZE
    scratch = tempfile.mkdtemp(prefix="default_path_")
    tree = os.path.join(scratch, "old")
    try:
        old_commit = worktree_at(args.old, tree)
        common.log(f"exporting with {args.old} ({old_commit[:12]}) and with the checkout")
        old_dir = export_with(tree, args.source, os.path.join(scratch, "export_old"), args.precision)
        new_dir = export_with(common.ROOT, args.source, os.path.join(scratch, "export_new"), args.precision)
        outputs = {}
        systems = [
            system("old", old_dir, sources, batch_size, outputs),
            system("new", new_dir, sources, batch_size, outputs, baseline="old"),
        ]
        results = common.run_alternating(systems, args.repeats)
    finally:
        subprocess.run(["git", "-C", common.ROOT, "worktree", "remove", "--force", tree], capture_output=True)
        shutil.rmtree(scratch, ignore_errors=True)
    identical = sum(a == b for a, b in zip(outputs["old"], outputs["new"]))
    ratio = common.paired_ratios(results, "old", "sentences")["new"]
    rows = [
        [r.name, common.fmt(r.median_rate("sentences"), ",.1f"), f"{common.median(r.seconds):.2f}"] for r in results
    ]
    print(common.markdown_table(["code", "sentences/s (median)", "seconds (median)"], rows))
    print(f"new/old speed (median of paired ratios): {ratio:.3f}; identical translations: {identical}/{len(sources)}")
    common.write_json(
        args.json,
        {
            "workload": f"Multi30k test2016, {len(sources)} sentences, the source's decoding, {args.precision}, "
            f"requests of {batch_size} sentences",
            "old_revision": args.old,
            "old_commit": old_commit,
            "source": args.source,
            "repeats": args.repeats,
            "identical_translations": identical,
            "sentences": len(sources),
            "new_over_old_paired_ratio": ratio,
            "machine": common.machine_info(),
            "versions": common.package_versions(["tensorflow", "keras", "tensorflow-text"]),
            "results": common.results_payload(results, ["sentences"]),
        },
    )


if __name__ == "__main__":
    main()
