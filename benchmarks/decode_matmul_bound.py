"""How fast TensorFlow runs the matmuls of one beam-search step, and nothing else: plain graph vs XLA's CPU backends.

A ceiling for any TensorFlow decoder of `decode_throughput.py`'s workload:
the small shape (3 decoder layers, d_model 256, d_ff 1024, vocabulary 8000),
128 rows per step (32 sentences x beam 4). Per layer: the fused Q/K/V
projection, the self-attention output, the cross-attention query and output
projections, the two feed-forward matmuls; then the output projection. No
attention, softmax, top-k or LayerNorm. The step runs `--steps` times in a
`tf.while_loop` (each step depending on the last, as in decoding); a variant's
time is the median over `--repeats` loops of the time per step.

Variants: the plain graph (TensorFlow's oneDNN kernels, what a SavedModel
and TF Serving run) and XLA (`jit_compile=True`), in float32 and bfloat16;
XLA with its own dot emitter and with each library TensorFlow 2.21's XLA
CPU backend can hand dots to (oneDNN, XNNPACK, YNNPACK), chosen by
`XLA_FLAGS`. XLA reads those once, when TensorFlow starts, so every variant
runs in a fresh process, in rounds that alternate between the variants;
the table shows each variant's median over the rounds and its median
per-round ratio to the plain bfloat16 graph.

    python benchmarks/decode_matmul_bound.py --json benchmarks/results/amd_epyc_avx512_bf16/decode_matmul_bound.json
"""

import argparse
import collections
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

# XLA's CPU backend choices for dots in TensorFlow 2.21 (its flags' names and values).
XLA_BACKENDS = {
    "XLA": "",
    "XLA oneDNN": "--xla_cpu_use_onednn=true",
    "XLA oneDNN fusion": "--xla_cpu_experimental_onednn_fusion_type=dot",
    "XLA XNNPACK fusion": "--xla_cpu_experimental_xnn_fusion_type=dot",
    "XLA YNNPACK fusion": "--xla_cpu_experimental_ynn_fusion_type=dot",
    "XLA YNNPACK dots": "--xla_cpu_experimental_ynn_fusion_type=individual_dot",
}
DTYPES = ("float32", "bfloat16")
BASELINE = "graph bfloat16"


def variants():
    """`{name: (dtype, jit_compile, XLA_FLAGS)}`, the plain graphs first."""
    table = {f"graph {dtype}": (dtype, False, "") for dtype in DTYPES}
    for backend, flags in XLA_BACKENDS.items():
        table.update({f"{backend} {dtype}": (dtype, True, flags) for dtype in DTYPES})
    return table


def step_flops(rows, layers, d_model, d_ff, vocab_size):
    """Multiply-adds x 2 of one step's matmuls."""
    d, f = d_model, d_ff
    return 2 * rows * (layers * (3 * d * d + 3 * d * d + 2 * d * f) + d * vocab_size)


def time_step(dtype, jit_compile, args):
    """`(median ms per step of `--repeats` loops of `--steps` steps, HLO summary)`, in this process.

    The HLO summary (XLA only, else None): the dots of the optimized module
    and the library fusions (`__ynn_fusion`, ...) XLA made of them, which
    tell whether a backend flag took effect.
    """
    import numpy as np
    import tensorflow as tf

    d, f, v = args.d_model, args.d_ff, args.vocab_size
    rng = np.random.default_rng(0)

    def weight(*shape):
        return tf.cast(tf.constant(rng.normal(size=shape).astype("float32") * 0.05), dtype)

    # qkv, self output, cross query, cross output, ffn in, ffn out
    layers = [
        (weight(d, 3 * d), weight(d, d), weight(d, d), weight(d, d), weight(d, f), weight(f, d))
        for _ in range(args.layers)
    ]
    output = weight(d, v)

    def step(x):
        for qkv, self_out, cross_q, cross_out, ffn_in, ffn_out in layers:
            x = x + tf.matmul(tf.matmul(x, qkv)[:, :d], self_out)
            x = x + tf.matmul(tf.matmul(x, cross_q), cross_out)
            x = x + tf.matmul(tf.nn.relu(tf.matmul(x, ffn_in)), ffn_out)
        return tf.matmul(x, output)

    @tf.function(jit_compile=jit_compile)
    def loop(x):
        def body(i, x, total):
            logits = step(x)  # each step depends on the last, as in decoding
            return i + 1, x + 1e-3 * logits[:, :d], total + logits[0, 0]

        return tf.while_loop(lambda i, x, total: i < args.steps, body, (0, x, tf.constant(0.0, dtype)))[2]

    x0 = weight(args.sentences * args.beam_size, d)
    loop(x0).numpy()  # trace and compile
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        loop(x0).numpy()
        seconds.append((time.perf_counter() - start) / args.steps)
    hlo = hlo_summary(loop.experimental_get_compiler_ir(x0)(stage="optimized_hlo")) if jit_compile else None
    return 1000 * float(np.median(seconds)), hlo


def hlo_summary(hlo_text):
    """`{"dots": n, "library_fusions": {name: count}}` of an optimized HLO module's text."""
    fusions = collections.Counter(re.findall(r"__(?:[a-z]+_fusion|onednn\$[a-z]+|xnn[a-z_]*)", hlo_text))
    return {"dots": len(re.findall(r" dot\(", hlo_text)), "library_fusions": dict(sorted(fusions.items()))}


def run_variant(name, argv):
    """One variant's `(median ms per step, HLO summary)`, measured in a fresh process with its `XLA_FLAGS`."""
    dtype, jit_compile, flags = variants()[name]
    env = dict(os.environ, XLA_FLAGS=" ".join(filter(None, [os.environ.get("XLA_FLAGS", ""), flags])))
    result = common.json_from_process([sys.executable, os.path.abspath(__file__), *argv, "--worker", name], name, env)
    return result["ms_per_step"], result["hlo"]


def _fusions_cell(hlo):
    if hlo is None:
        return "-"
    fusions = ", ".join(f"{count} {name}" for name, count in hlo["library_fusions"].items())
    return f"{hlo['dots']} dots; " + (fusions or "none")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=32, help="sentences per batch")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="timed loops per process; their median")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of fresh processes")
    parser.add_argument("--only", help="comma-separated variant name prefixes (e.g. 'graph,XLA oneDNN')")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # internal: time one variant in this process
    args = parser.parse_args(argv)

    if args.worker:
        common.quiet_tensorflow()
        dtype, jit_compile, _ = variants()[args.worker]
        ms_per_step, hlo = time_step(dtype, jit_compile, args)
        print(json.dumps({"ms_per_step": ms_per_step, "hlo": hlo}), flush=True)
        return

    names = [
        name for name in variants() if not args.only or any(name.startswith(p.strip()) for p in args.only.split(","))
    ]
    worker_argv = [a for a in argv if not a.startswith("--json") and a != args.json]
    times, hlo = {name: [] for name in names}, {}
    for round_index in range(args.rounds):
        for name in names:
            ms_per_step, hlo[name] = run_variant(name, worker_argv)
            times[name].append(ms_per_step)
            common.log(f"[round {round_index + 1}/{args.rounds}] {name}: {times[name][-1]:.2f} ms per step")

    rows = args.sentences * args.beam_size
    flops = step_flops(rows, args.layers, args.d_model, args.d_ff, args.vocab_size)
    results = []
    for name in names:
        dtype, jit_compile, flags = variants()[name]
        median_ms = common.median(times[name])
        ratios = [b / t for t, b in zip(times[name], times[BASELINE])] if BASELINE in times else []
        results.append(
            {
                "variant": name,
                "dtype": dtype,
                "xla": jit_compile,
                "xla_flags": flags,
                "ms_per_step": [round(t, 3) for t in times[name]],
                "median_ms_per_step": round(median_ms, 3),
                "gflops": round(flops / median_ms / 1e6, 1),
                "speed_vs_graph_bfloat16": round(common.median(ratios), 3) if ratios else None,
                "hlo": hlo[name],
            }
        )
    print(
        common.markdown_table(
            ["variant", "XLA_FLAGS", "ms per step", "GFLOP/s", f"x {BASELINE}", "library fusions of the dots"],
            [
                [
                    r["variant"],
                    r["xla_flags"] or "-",
                    f"{r['median_ms_per_step']:.2f}",
                    f"{r['gflops']:.0f}",
                    "-" if r["speed_vs_graph_bfloat16"] is None else f"{r['speed_vs_graph_bfloat16']:.2f}",
                    _fusions_cell(r["hlo"]),
                ]
                for r in results
            ],
        )
    )
    common.write_json(
        args.json,
        {
            "benchmark": "decode_matmul_bound",
            "workload": {
                "rows": rows,
                "layers": args.layers,
                "d_model": args.d_model,
                "d_ff": args.d_ff,
                "vocab_size": args.vocab_size,
                "steps": args.steps,
                "repeats": args.repeats,
                "flops_per_step": flops,
            },
            "rounds": args.rounds,
            "results": results,
            "machine": common.machine_info(),
            "versions": common.package_versions(["tensorflow", "keras"]),
        },
    )


if __name__ == "__main__":
    main()
