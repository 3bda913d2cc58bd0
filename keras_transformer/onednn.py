"""TensorFlow's oneDNN optimizations, turned on before TensorFlow loads.

TensorFlow rewrites its CPU graphs to oneDNN kernels (`_MklMatMul`,
`_MklSoftmax`, fused matmuls) by default only on CPUs with AVX512_VNNI,
AVX512_BF16 or AMX. Elsewhere (AVX2-only CPUs, e.g. an AMD EPYC Milan) it runs
Eigen's kernels unless `TF_ENABLE_ONEDNN_OPTS=1`, which it reads once, when it
is imported. On a 2-core AVX2-only AMD EPYC, with oneDNN a float32 training
step of the small model ran 1.19x as many tokens per second (median of three
alternated rounds, 1.08-1.20x), and translating test2016 through a float32
SavedModel 1.10x as many sentences per second, within that machine's noise
(0.91-1.17x): `benchmarks/onednn_opts.py`, results in
`benchmarks/results/amd_epyc_avx2/onednn_opts.json`. Tiny models (the tests')
run slower with it: oneDNN's per-op overhead outweighs its faster kernels.

Importing `keras_transformer` before TensorFlow therefore sets the variable to
1 unless it is already set; `TF_ENABLE_ONEDNN_OPTS=0` keeps Eigen's kernels. Where TensorFlow is already
imported, its choice stands.
"""

import os
import sys

VARIABLE = "TF_ENABLE_ONEDNN_OPTS"


def enable_onednn_opts(environ=None, modules=None):
    """Sets `TF_ENABLE_ONEDNN_OPTS=1` if unset and TensorFlow not yet imported; returns whether it did."""
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if VARIABLE in environ or "tensorflow" in modules:
        return False
    environ[VARIABLE] = "1"
    return True
