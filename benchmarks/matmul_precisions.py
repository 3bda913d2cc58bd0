"""A decoding step's matmul shapes in float32, bfloat16 and int8, in TensorFlow graph mode on this CPU.

Why the SavedModel decodes in bfloat16 where the CPU has AVX512_BF16 and not
in int8: the feed-forward (`[R, 256] x [256, 1024]`) and output-projection
(`[R, 256] x [256, 8000]`) matmuls of the small model at R = 256 and 1024
hypothesis rows, as `tf.matmul` (int8 inputs with an int32 result:
`output_type=tf.int32`) and as a Keras `Dense` before and after
`layer.quantize("int8")`. Each is a `tf.function` run `--repeats` times
after a warm-up; the median time per call is reported.

    .venv/bin/python benchmarks/matmul_precisions.py --json benchmarks/results/avx512_bf16/matmul_precisions.json
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

SHAPES = {"feed_forward": (256, 1024), "output_projection": (256, 8000)}


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(1e3 * statistics.median(times), 3)


def matmul_times(rows, inner, outer, repeats):
    x = tf.random.normal([rows, inner])
    w = tf.random.normal([inner, outer])
    operands = {
        "float32": (x, w),
        "bfloat16": (tf.cast(x, tf.bfloat16), tf.cast(w, tf.bfloat16)),
        "int8": (
            tf.cast(tf.clip_by_value(x * 30, -127, 127), tf.int8),
            tf.cast(tf.clip_by_value(w * 30, -127, 127), tf.int8),
        ),
    }
    times = {}
    for name, (a, b) in operands.items():
        kwargs = {"output_type": tf.int32} if name == "int8" else {}
        fn = tf.function(lambda a=a, b=b, kwargs=kwargs: tf.linalg.matmul(a, b, **kwargs))
        times[f"tf.matmul {name}"] = median_ms(fn, repeats)
    for name in ("float32", "int8"):
        layer = keras.layers.Dense(outer)
        layer.build((None, inner))
        if name == "int8":
            layer.quantize("int8")
        fn = tf.function(lambda layer=layer: layer(x))
        times[f"keras Dense {name}"] = median_ms(fn, repeats)
    return times


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = {}
    for rows in (256, 1024):
        for shape_name, (inner, outer) in SHAPES.items():
            key = f"{shape_name} [{rows}, {inner}] x [{inner}, {outer}]"
            results[key] = matmul_times(rows, inner, outer, args.repeats)
            print(key, results[key], flush=True)
    common.write_json(
        args.json,
        {
            "benchmark": "matmul_precisions",
            "unit": "ms per call (median)",
            "results": results,
            "machine": common.machine_info(),
            "versions": common.package_versions(["tensorflow", "keras"]),
        },
    )


if __name__ == "__main__":
    main()
