"""What an export's warm-up requests save the first requests TensorFlow Serving answers.

Each round starts two fresh processes on the export (`EXPORT_DIR`, a
version directory), each loading it into one TensorFlow session
(`tf.compat.v1.saved_model.load`) with one intra-op and two inter-op threads,
the setting `decode_serving.py` found fastest, as TensorFlow Serving holds a
version (the process also imports this package, to read the warm-up file and
the test sentences; TensorFlow Serving itself is not run).
"cold" sends the requests right after loading; "warmed" first replays the
export's `assets.extra/tf_serving_warmup_requests` through the signature, as
TensorFlow Serving does before it serves a version, and reports that replay's
time. Then both send one request of each `--sizes` (sentences of Multi30k
test2016, which the warm-up requests, made of validation sentences, do not
contain), and the same requests once more: "first" and "again". Medians
over `--rounds` rounds that alternate the two.

    python benchmarks/serving_warmup.py EXPORT_DIR \\
        --json benchmarks/results/amd_epyc_avx512_bf16/serving_warmup.json
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

MODES = ("cold", "warmed")


def serve(export_dir, mode, sizes):
    """In this process: loads `export_dir`, replays its warm-up requests (`warmed`), times the requests."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    from keras_transformer.data.corpora import read_lines
    from keras_transformer.inference.serving_warmup import read_warmup_requests
    from keras_transformer.inference.signatures import INPUT_NAME, SIGNATURE_NAME

    started = time.perf_counter()
    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=2)
    session = tf.compat.v1.Session(graph=graph, config=config)
    with graph.as_default():
        signatures = tf.compat.v1.saved_model.load(session, ["serve"], export_dir).signature_def
    result = {"load_seconds": time.perf_counter() - started}

    def request(signature_name, sentences):
        signature = signatures[signature_name]
        start = time.perf_counter()
        session.run(signature.outputs["translations"].name, {signature.inputs[INPUT_NAME].name: sentences})
        return time.perf_counter() - start

    if mode == "warmed":
        replay = read_warmup_requests(export_dir)
        if not replay:
            raise SystemExit(f"{export_dir} has no warm-up requests (assets.extra/tf_serving_warmup_requests).")
        result["warmup_seconds"] = sum(request(name, sentences) for name, sentences in replay)
        result["warmup_requests"] = [len(sentences) for _, sentences in replay]
    test, offset = read_lines("test2016", "en"), 0
    batches = []
    for size in sizes:
        batches.append(test[offset : offset + size])
        offset += size
    result["first"] = {str(len(batch)): request(SIGNATURE_NAME, batch) for batch in batches}
    result["again"] = {str(len(batch)): request(SIGNATURE_NAME, batch) for batch in batches}
    return result


def run_worker(export_dir, mode, sizes):
    """`serve` in a fresh process; its result."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        export_dir,
        "--worker",
        mode,
        "--sizes",
        ",".join(map(str, sizes)),
    ]
    return common.json_from_process(command, f"{mode} worker", dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))


def summarize(rounds):
    """Medians over the rounds: `{mode: {"load_seconds", "warmup_seconds"?, "first": {size}, "again": {size}}}`."""
    summary = {}
    for mode in MODES:
        runs = [r[mode] for r in rounds]
        entry = {"load_seconds": round(common.median([r["load_seconds"] for r in runs]), 3)}
        if mode == "warmed":
            entry["warmup_seconds"] = round(common.median([r["warmup_seconds"] for r in runs]), 3)
            entry["warmup_requests"] = runs[0]["warmup_requests"]
        for phase in ("first", "again"):
            entry[phase] = {size: round(common.median([r[phase][size] for r in runs]), 3) for size in runs[0][phase]}
        summary[mode] = entry
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", metavar="EXPORT_DIR", help="an exported version directory (OUTPUT/<version>)")
    parser.add_argument(
        "--sizes", default="1,64,500", help="sentences per request, comma-separated (default %(default)s)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)  # internal: one process's run
    args = parser.parse_args(argv)
    try:
        sizes = [int(size) for size in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes takes comma-separated integers, got {args.sizes!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--sizes takes positive integers, got {args.sizes!r}")

    if args.worker:
        common.quiet_tensorflow()
        print(json.dumps(serve(args.export_dir, args.worker, sizes)), flush=True)
        return None

    rounds = []
    for index in range(args.rounds):
        modes = MODES if index % 2 == 0 else MODES[::-1]
        rounds.append({mode: run_worker(args.export_dir, mode, sizes) for mode in modes})
        common.log(
            f"[round {index + 1}/{args.rounds}] "
            + "; ".join(f"{mode}: first {rounds[-1][mode]['first']}" for mode in MODES)
        )
    summary = summarize(rounds)
    rows = [
        [
            f"{size} sentence" + ("" if size == "1" else "s"),
            f"{summary['cold']['first'][size]:.3f}",
            f"{summary['warmed']['first'][size]:.3f}",
            f"{summary['cold']['again'][size]:.3f}",
        ]
        for size in summary["cold"]["first"]
    ]
    print(
        common.markdown_table(
            ["request", "first after loading (s)", "first after the warm-up (s)", "the same request again (s)"], rows
        )
    )
    print(
        f"warm-up replay at load: {summary['warmed']['warmup_seconds']:.2f} s "
        f"(requests of {summary['warmed']['warmup_requests']} sentences)"
    )
    payload = {
        "benchmark": "serving_warmup",
        "export_dir": args.export_dir,
        "sizes": sizes,
        "rounds": rounds,
        "summary": summary,
        "machine": common.machine_info(),
        "versions": common.package_versions(["tensorflow", "tensorflow-text", "tensorflow-serving-api"]),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
