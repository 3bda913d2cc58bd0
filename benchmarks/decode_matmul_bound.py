"""How fast TensorFlow can run the matmuls of one beam-search step, and nothing else.

A ceiling for any TensorFlow decoder of `decode_throughput.py`'s workload:
the small shape (3 decoder layers, d_model 256, d_ff 1024, vocabulary 8000),
128 rows per step (32 sentences x beam 4). Per layer: the fused Q/K/V
projection, the self-attention output, the cross-attention query and output
projections, the two feed-forward matmuls; then the output projection. No
attention, softmax, top-k or LayerNorm. The step runs 20 times in a
`tf.while_loop`, in graph mode and under XLA; the printed tok/s is
32 generated tokens per step divided by the step time.

    python benchmarks/decode_matmul_bound.py
    XLA_FLAGS=--xla_cpu_use_onednn=true python benchmarks/decode_matmul_bound.py --xla-only
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sentences", type=int, default=32, help="sentences per batch")
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7, help="timed loops; the median is printed")
    parser.add_argument("--xla-only", action="store_true")
    args = parser.parse_args(argv)

    rows, d, f, v = args.sentences * args.beam_size, args.d_model, args.d_ff, args.vocab_size
    rng = np.random.default_rng(0)

    def weight(*shape):
        return tf.constant(rng.normal(size=shape).astype("float32") * 0.05)

    # qkv, self output, cross query, cross output, ffn in, ffn out
    layers = [(weight(d, 3 * d), weight(d, d), weight(d, d), weight(d, d), weight(d, f), weight(f, d))
              for _ in range(args.layers)]
    output = weight(d, v)
    flops = 2 * rows * (args.layers * (3 * d * d + 3 * d * d + 2 * d * f) + d * v)

    def step(x):
        for qkv, self_out, cross_q, cross_out, ffn_in, ffn_out in layers:
            x = x + tf.matmul(tf.matmul(x, qkv)[:, :d], self_out)
            x = x + tf.matmul(tf.matmul(x, cross_q), cross_out)
            x = x + tf.matmul(tf.nn.relu(tf.matmul(x, ffn_in)), ffn_out)
        return tf.matmul(x, output)

    x0 = weight(rows, d)
    for jit in (True,) if args.xla_only else (False, True):
        @tf.function(jit_compile=jit)
        def loop(x):
            def body(i, x, total):
                logits = step(x)  # each step depends on the last, as in decoding
                return i + 1, x + 1e-3 * logits[:, :d], total + logits[0, 0]

            return tf.while_loop(lambda i, x, total: i < args.steps, body, (0, x, 0.0))[2]

        loop(x0).numpy()  # trace and compile
        seconds = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            loop(x0).numpy()
            seconds.append((time.perf_counter() - start) / args.steps)
        ms = 1000 * float(np.median(seconds))
        print(f"{'XLA' if jit else 'graph'}: {ms:.2f} ms per step of matmuls only ({flops / ms / 1e6:.0f} GFLOP/s): "
              f"at most {args.sentences / ms * 1000:,.0f} generated tok/s")


if __name__ == "__main__":
    main()
