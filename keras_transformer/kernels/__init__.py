"""CPU and compiler kernel forms of the paper's computations.

The layers in `keras_transformer.layers` show each computation of the paper
(Vaswani et al., 2017) the way the paper writes it. Some of them also have a
second form here, equal to the plain one in value (and in gradient where it
trains), written so that TensorFlow's oneDNN rewrite or XLA runs it as fewer,
faster kernels. A layer calls its kernel in one line, under one named
condition, and `tests/test_kernels.py` checks that each kernel equals the
plain form it replaces. Measurements are in `benchmarks/README.md`.

Modules:

- `layer_norm`: the layer normalization of §3.1 written as the NCHW batch
  norm pattern that oneDNN fuses into one kernel (inference in a TensorFlow
  graph), and its closed-form gradient.
- `dropout`: dropout (§5.4) whose keep decisions are random integers, so the
  rate is exact in every dtype.
- `matmul`: the position-wise matmuls of §3.2.2-§3.4, placed by hand on the
  `[B*T, D]` rows.
- `adam`: the fused Adam update (§5.3).
- `loss`: the fused label-smoothed cross-entropy (§5.4).
- `divergence`: the fused symmetric KL divergence of R-Drop's two passes
  (`training.rdrop`; not in the paper).

Nothing is imported here, so importing the package loads nothing.
"""
