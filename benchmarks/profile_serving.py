"""Where a SavedModel's translation request spends its time: per-op-type totals from a traced session run.

Loads each export (`EXPORT_DIR`, a version directory) with only tensorflow
and tensorflow_text, as a model server would, warms it up on one request of
the first `--sentences` sentences of Multi30k test2016 (file order), times
that request untraced, then runs it once more under `FULL_TRACE` and sums
each op type's time over all threads. Writes the top ops per export.

    .venv/bin/python benchmarks/profile_serving.py before=/tmp/old_export/1 after=/tmp/new_export/1 \
        --json benchmarks/results/avx512_bf16/profile_serving.json
"""

import argparse
import collections
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()


def profile(export_dir, sentences, top):
    import tensorflow as tf
    import tensorflow_text  # noqa: F401

    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2, inter_op_parallelism_threads=2)
    with graph.as_default(), tf.compat.v1.Session(graph=graph, config=config) as session:
        meta_graph = tf.compat.v1.saved_model.load(session, ["serve"], export_dir)
        signature = meta_graph.signature_def["serving_default"]
        feed = {signature.inputs["inputs"].name: sentences}
        output = signature.outputs["translations"].name
        session.run(output, feed)  # warm-up
        started = time.perf_counter()
        session.run(output, feed)
        seconds = time.perf_counter() - started
        metadata = tf.compat.v1.RunMetadata()
        session.run(output, feed, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                    run_metadata=metadata)
    op_micros, op_runs = collections.Counter(), collections.Counter()
    for device in metadata.step_stats.dev_stats:
        for node in device.node_stats:
            label = node.timeline_label
            op = label.split("=", 1)[-1].split("(")[0].strip() if "=" in label else node.node_name
            op_micros[op] += node.all_end_rel_micros
            op_runs[op] += 1
    total = sum(op_micros.values())
    return {
        "request_seconds": round(seconds, 3),
        "sentences_per_second": round(len(sentences) / seconds, 1),
        "op_seconds_all_threads": round(total / 1e6, 3),
        "op_runs": sum(op_runs.values()),
        "top_ops": [{"op": op, "ms": round(us / 1e3, 1), "share": round(us / total, 3), "runs": op_runs[op]}
                    for op, us in op_micros.most_common(top)],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("exports", nargs="+", metavar="NAME=EXPORT_DIR")
    parser.add_argument("--sentences", type=int, default=250)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    from keras_transformer.data import corpora

    sentences = corpora.read_lines("test2016", "en")[: args.sentences]
    profiles = {}
    for item in args.exports:
        name, export_dir = item.split("=", 1)
        profiles[name] = dict(export=export_dir, **profile(export_dir, sentences, args.top))
        print(f"\n{name}: {profiles[name]['request_seconds']} s per request of {len(sentences)}, "
              f"{profiles[name]['op_runs']} op runs")
        print(common.markdown_table(["op", "ms", "share", "runs"], [
            [o["op"], o["ms"], f"{100 * o['share']:.1f}%", o["runs"]] for o in profiles[name]["top_ops"]]))
    common.write_json(args.json, {"benchmark": "profile_serving", "sentences": len(sentences),
                                  "machine": common.machine_info(), "profiles": profiles,
                                  "versions": common.package_versions(["tensorflow", "tensorflow-text"])})


if __name__ == "__main__":
    main()
