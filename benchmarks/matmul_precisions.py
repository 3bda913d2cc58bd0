"""A decoding step's matmul shapes in float32, bfloat16 and int8, in TensorFlow graph mode on this CPU.

Why the SavedModel decodes in bfloat16 where the CPU has AVX512_BF16 and not
in int8: the feed-forward (`[R, 256] x [256, 1024]`) and output-projection
(`[R, 256] x [256, 8000]`) matmuls of the small model at R = 256 and 1024
hypothesis rows, as `tf.matmul` (int8 inputs with an int32 result:
`output_type=tf.int32`), as a Keras `Dense` before and after
`layer.quantize("int8")`, and as oneDNN's int8 inner product
(`tf.raw_ops.QuantizedMatMulWithBiasAndDequantize`, uint8 activations times
int8 weights with a float32 result). Each is a `tf.function` run `--repeats`
times after a warm-up; the median time per call is reported.

The oneDNN int8 columns quantize the weights once (symmetric, one scale per
tensor) and the activations on every call (asymmetric uint8, one range per
tensor, zero point folded into the bias): "oneDNN int8" times quantizing the
float32 activations and the GEMM, "oneDNN int8 GEMM" the GEMM alone on
activations quantized beforehand. The op is called in `SCALED` mode with
`min_a = 0`: its own `MIN_FIRST` zero-point correction is not used, as with a
float32 output it adds that term in the wrong units. Its registered kernel
computes nothing until TensorFlow's oneDNN graph rewrite replaces it
(`TF_ENABLE_ONEDNN_OPTS=1`); without it these columns are left out. Each
shape's oneDNN int8 result is checked against float32 before timing, and its
relative error (largest absolute error over largest absolute value) is reported.

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
# Eight-bit rounding of activations and weights over K = 256 stays well below this.
MAX_INT8_RELATIVE_ERROR = 5e-2


def median_ms(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return round(1e3 * statistics.median(times), 3)


def quantize_weights(w):
    """Quantizes float32 weights `[K, N]` once for `onednn_int8_gemm`, symmetric with one scale.

    Returns:
        A tuple `(qint8 weights, max |w|, column sums of the int8 weights as float32)`.
    """
    w_max = tf.reduce_max(tf.abs(w))
    wq = tf.cast(tf.round(w * (127.0 / w_max)), tf.int8)
    return tf.bitcast(wq, tf.qint8), w_max, tf.reduce_sum(tf.cast(wq, tf.float32), axis=0)


def quantize_activations(x):
    """Quantizes float32 activations `[R, K]` to uint8 over their range: `x ~ x_min + q * x_range / 255`.

    Returns:
        A tuple `(quint8 activations, x_min, x_range)`.
    """
    x_min = tf.reduce_min(x)
    x_range = tf.maximum(tf.reduce_max(x) - x_min, 1e-6)
    q = tf.cast(tf.round((x - x_min) * (255.0 / x_range)), tf.uint8)
    return tf.bitcast(q, tf.quint8), x_min, x_range


def onednn_int8_gemm(xq, x_min, x_range, weights, bias):
    """`x @ w + bias` in float32 from `quantize_activations` and `quantize_weights` outputs, by oneDNN.

    With `min_a = 0` in `SCALED` mode the op computes
    `(x_range / 255) * (w_max / 127) * (q_x @ q_w) + bias`; the activations'
    offset `x_min` times the weights' column sums is added to the bias here.
    """
    wq, w_max, column_sums = weights
    return tf.raw_ops.QuantizedMatMulWithBiasAndDequantize(
        a=xq,
        b=wq,
        bias=bias + x_min * (w_max / 127.0) * column_sums,
        min_a=tf.constant(0.0),
        max_a=x_range,
        min_b=-w_max,
        max_b=w_max,
        min_freezed_output=tf.constant(0.0),
        max_freezed_output=tf.constant(0.0),
        Toutput=tf.float32,
        input_quant_mode="SCALED",
    )


def onednn_int8_matmul(x, weights, bias):
    """`x @ w + bias` for float32 `x`, quantized on the call, and weights from `quantize_weights`."""
    return onednn_int8_gemm(*quantize_activations(x), weights, bias)


def onednn_int8_times(x, w, repeats):
    """Times the oneDNN int8 columns after checking their result against float32.

    Returns:
        A tuple `(times, relative error)`, or `({}, None)` when the oneDNN graph rewrite is off.
    """
    weights = quantize_weights(w)
    bias = tf.zeros([w.shape[1]])
    matmul = tf.function(lambda: onednn_int8_matmul(x, weights, bias))
    try:
        result = matmul()
    except tf.errors.InternalError:
        print("oneDNN int8 skipped: it needs TF_ENABLE_ONEDNN_OPTS=1", file=sys.stderr)
        return {}, None
    reference = tf.linalg.matmul(x, w)
    error = float(tf.reduce_max(tf.abs(result - reference)) / tf.reduce_max(tf.abs(reference)))
    if not error <= MAX_INT8_RELATIVE_ERROR:
        raise SystemExit(f"oneDNN int8 matmul: relative error {error:.3g} exceeds {MAX_INT8_RELATIVE_ERROR}")
    xq, x_min, x_range = quantize_activations(x)
    gemm = tf.function(lambda: onednn_int8_gemm(xq, x_min, x_range, weights, bias))
    times = {"oneDNN int8": median_ms(matmul, repeats), "oneDNN int8 GEMM": median_ms(gemm, repeats)}
    return times, round(error, 5)


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
    onednn_times, error = onednn_int8_times(x, w, repeats)
    times.update(onednn_times)
    return times, error


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    results = {}
    errors = {}
    for rows in (256, 1024):
        for shape_name, (inner, outer) in SHAPES.items():
            key = f"{shape_name} [{rows}, {inner}] x [{inner}, {outer}]"
            results[key], errors[key] = matmul_times(rows, inner, outer, args.repeats)
            print(key, results[key], "oneDNN int8 relative error:", errors[key], flush=True)
    common.write_json(
        args.json,
        {
            "benchmark": "matmul_precisions",
            "unit": "ms per call (median)",
            "results": results,
            "onednn_int8_relative_error": errors,
            "machine": common.machine_info(),
            "versions": common.package_versions(["tensorflow", "keras"]),
        },
    )


if __name__ == "__main__":
    main()
