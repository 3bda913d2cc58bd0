"""Where a SavedModel's translation request spends its time: per-op-type totals from a traced session run.

Loads each export (`EXPORT_DIR`, a version directory) with only tensorflow
and tensorflow_text, as a model server would, each in a session of its own,
and warms it up on one request of the first `--sentences` sentences of
Multi30k test2016 (file order). Then times that request untraced in
`--rounds` rounds that alternate between the exports (median and every
round's time), runs it once more under `FULL_TRACE` and sums each op type's
time over all threads. Writes the times and the top ops per export.

    .venv/bin/python benchmarks/profile_serving.py before=/tmp/old_export/1 after=/tmp/new_export/1 \
        --json benchmarks/results/avx512_bf16/profile_serving.json
"""

import argparse
import collections
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()


class ServedExport:
    """One export loaded in its own graph and session, as TF Serving runs it: `run()` serves the request."""

    def __init__(self, export_dir, sentences, threads=2):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401

        self.graph = tf.Graph()
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
        self.session = tf.compat.v1.Session(graph=self.graph, config=config)
        with self.graph.as_default():
            signature = tf.compat.v1.saved_model.load(self.session, ["serve"], export_dir).signature_def[
                "serving_default"
            ]
        self.feed = {signature.inputs["inputs"].name: sentences}
        self.output = signature.outputs["translations"].name
        self.run()  # warm-up

    def run(self, **kwargs):
        return self.session.run(self.output, self.feed, **kwargs)

    def close(self):
        self.session.close()

    def timed(self):
        started = time.perf_counter()
        self.run()
        return time.perf_counter() - started


def profile(served, seconds, sentence_count, top):
    """`served`'s request traced once: per-op-type totals; `seconds`: the request's timed rounds."""
    import tensorflow as tf

    metadata = tf.compat.v1.RunMetadata()
    served.run(options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE), run_metadata=metadata)
    request_seconds = common.median(seconds)
    op_micros, op_runs = collections.Counter(), collections.Counter()
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            label = node.timeline_label
            op = label.split("=", 1)[-1].split("(")[0].strip() if "=" in label else node.node_name
            op_micros[op] += node.all_end_rel_micros
            op_runs[op] += 1
    total = sum(op_micros.values())
    return {
        "request_seconds": round(request_seconds, 3),
        "rounds_seconds": [round(t, 3) for t in seconds],
        "sentences_per_second": round(sentence_count / request_seconds, 1),
        "op_seconds_all_threads": round(total / 1e6, 3),
        "op_runs": sum(op_runs.values()),
        "top_ops": [
            {"op": op, "ms": round(us / 1e3, 1), "share": round(us / total, 3), "runs": op_runs[op]}
            for op, us in op_micros.most_common(top)
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", metavar="NAME=EXPORT_DIR")
    parser.add_argument("--sentences", type=int, default=250)
    parser.add_argument("--rounds", type=int, default=1, help="timed requests per export, alternating; median")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument(
        "--threads",
        type=int,
        default=2,
        help="TensorFlow's intra-op and inter-op threads (default 2; 1 as each of decode_serving.py's "
        "requests in flight runs)",
    )
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    from keras_transformer.data import corpora

    sentences = corpora.read_lines("test2016", "en")[: args.sentences]
    exports = dict(item.split("=", 1) for item in args.exports)
    with contextlib.ExitStack() as stack:
        served = {}
        for name, export_dir in exports.items():
            served[name] = ServedExport(export_dir, sentences, args.threads)
            stack.callback(served[name].close)
        seconds = {name: [] for name in served}
        for _ in range(args.rounds):
            for name in served:
                seconds[name].append(served[name].timed())
        profiles = {
            name: dict(export=exports[name], **profile(served[name], seconds[name], len(sentences), args.top))
            for name in served
        }
    for name in profiles:
        print(
            f"\n{name}: {profiles[name]['request_seconds']} s per request of {len(sentences)} "
            f"(median of {args.rounds}), {profiles[name]['op_runs']} op runs"
        )
        print(
            common.markdown_table(
                ["op", "ms", "share", "runs"],
                [[o["op"], o["ms"], f"{100 * o['share']:.1f}%", o["runs"]] for o in profiles[name]["top_ops"]],
            )
        )
    common.write_json(
        args.json,
        {
            "benchmark": "profile_serving",
            "sentences": len(sentences),
            "rounds": args.rounds,
            "threads": args.threads,
            "machine": common.machine_info(),
            "profiles": profiles,
            "versions": common.package_versions(["tensorflow", "tensorflow-text"]),
        },
    )


if __name__ == "__main__":
    main()
