"""Position-wise matmuls placed by hand on the `[B*T, D]` rows (Vaswani et al., 2017, §3.2.2-§3.4).

Every projection of the Transformer (W^Q, W^K, W^V, W^O of §3.2.2, the two
maps of §3.3, the pre-softmax projection of §3.4) acts on each position
separately, `x W` for `x [..., D]`, `W [D, E]`. The plain form is
`keras.ops.matmul(x, W)`; on a rank-3 input TensorFlow runs it as
`tf.tensordot`, which reads the input's shape at run time with about ten
small ops around each matmul. The form here multiplies the rows of all
positions as one 2-D matmul, and reshapes with a target known but for one
axis, so it needs no shape ops (`leading_shape`). That matters in a decoding
step, a while loop of many small ops, and a 2-D matmul is also what
TensorFlow's oneDNN rewrite fuses with a bias and ReLU. The results equal
`ops.matmul`'s (`tests/test_kernels.py`).

Example:
>>> from keras import ops
>>> x, kernel = ops.ones((2, 3, 4)), ops.ones((4, 5))
>>> tuple(position_wise_matmul(x, kernel).shape)
(2, 3, 5)
"""

import math

from keras import ops


def leading_shape(x, merged_axes=1):
    """`x`'s shape without its last `merged_axes` axes (the features), as a reshape target.

    Static sizes as ints; when only one size is unknown, -1 for it (the
    reshape infers it: no shape ops in the graph); otherwise the unknown
    sizes read at run time. A static size of 0 leaves -1 nothing to infer
    from, so it reads every unknown size too.
    """
    static = tuple(x.shape[:-merged_axes])
    unknown = [axis for axis, size in enumerate(static) if size is None]
    if len(unknown) <= 1 and 0 not in static:
        return tuple(-1 if size is None else size for size in static)
    dynamic = ops.shape(x)
    return tuple(dynamic[axis] if size is None else size for axis, size in enumerate(static))


def apply_to_rows(fn, x, merged_axes=1):
    """`fn` applied to the rows of `x [..., *F]`: `fn([prod(...), prod(F)]) -> [R, E]`, returned as `[..., E]`.

    `merged_axes`: how many trailing axes of `x` are features (2 for the heads
    of a `[B, T, N, H]` attention output); their sizes must be known. A
    rank-2 `x` with one feature axis is already rows: `fn(x)`.
    """
    if len(x.shape) == 2 and merged_axes == 1:
        return fn(x)
    features = _known_features(tuple(x.shape), merged_axes)
    outputs = fn(ops.reshape(x, (-1, math.prod(features))))
    return ops.reshape(outputs, leading_shape(x, merged_axes) + (outputs.shape[-1],))


def position_wise_matmul(x, kernel, merged_axes=1):
    """`x [..., D] @ kernel [D, E] -> [..., E]`, as one matmul of the rows `[prod(...), D]` (`apply_to_rows`).

    With `merged_axes=2`, D is the product of `x`'s last two axes (heads
    concatenated, as before W^O). An input of unknown rank, or of unknown
    width D, goes to `ops.matmul` as it is (`merged_axes=1` only).
    """
    shape = _shape_or_none(x)
    if shape is None or (merged_axes == 1 and shape[-1] is None):
        return ops.matmul(x, kernel)
    width = math.prod(_known_features(shape, merged_axes))
    if kernel.shape[0] is not None and kernel.shape[0] != width:
        raise ValueError(
            f"A position-wise matmul of an input of shape {shape} ({width} features in its last "
            f"{merged_axes} axes) by a kernel of shape {tuple(kernel.shape)}: the sizes differ."
        )
    return apply_to_rows(lambda rows: ops.matmul(rows, kernel), x, merged_axes)


def _known_features(shape, merged_axes):
    """The sizes of the last `merged_axes` axes of `shape` (the features), which must be known."""
    features = shape[-merged_axes:]
    if None in features:
        raise ValueError(
            f"The last {merged_axes} axes of a position-wise input must have known sizes, got shape {shape}."
        )
    return features


def _shape_or_none(x):
    """`x`'s static shape as a tuple, or None if even its rank is unknown."""
    try:
        return tuple(x.shape)
    except ValueError:  # a TensorFlow tensor of unknown rank
        return None
