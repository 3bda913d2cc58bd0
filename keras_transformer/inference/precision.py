"""The precision a model decodes in, and `"auto"`: bfloat16 where the hardware computes it natively.

Decoding is a different workload from training: no gradients, no loss
scaling, and the weights can be stored in the 16-bit type itself, so that no
step casts them. On a CPU with AVX512_BF16 / AMX-BF16, oneDNN runs bfloat16
matmuls natively and a SavedModel exported in "bfloat16" translates faster
than in float32 (`benchmarks/decode_serving.py`, figures in
`benchmarks/README.md`); without those instructions bfloat16 is emulated and
slower than float32. The hardware is read by `keras_transformer.hardware`,
as training's own choice is. Softmaxes, layer normalization statistics and
the search's log-probabilities stay in float32 in every precision.
"""

from keras_transformer.hardware import auto_precision

# Dtype policies a model can decode under. "bfloat16" stores the weights in
# bfloat16 too (half the size, no per-step casts); the mixed ones keep
# float32 weights and cast them at every use.
DECODING_PRECISIONS = ("float32", "bfloat16", "mixed_bfloat16", "mixed_float16")
DECODING_PRECISION_CHOICES = ("auto",) + DECODING_PRECISIONS


def auto_decoding_precision(cpuinfo_path="/proc/cpuinfo", gpu_capabilities=None, environ=None):
    """The dtype policy that decodes fastest on this machine, and why: `(policy, reason)`.

    "bfloat16" where training's `hardware.auto_precision` picks mixed_bfloat16 (a CPU
    with AVX512_BF16 or AMX-BF16, or GPUs of compute capability >= 8.0),
    "mixed_float16" on older tensor-core GPUs (float16 weights alone would
    overflow more easily), else "float32". The choice is the exporting
    machine's: a model exported in bfloat16 and served on a CPU without
    native bfloat16 runs emulated, slower than float32.
    """
    policy, reason = auto_precision(cpuinfo_path, gpu_capabilities, environ)
    if policy == "mixed_bfloat16":
        return "bfloat16", reason
    return policy, reason


def resolve_decoding_precision(precision):
    """`(policy or None, reason or None)`: "auto" resolved for this machine; None (the model's own) kept."""
    if precision is None:
        return None, None
    if precision == "auto":
        policy, reason = auto_decoding_precision()
        return policy, f"auto: {reason}"
    if precision not in DECODING_PRECISIONS:
        raise ValueError(f"precision must be 'auto' or one of {', '.join(DECODING_PRECISIONS)}, got {precision!r}.")
    return precision, None
