"""Position-wise matrix products: `[..., D] @ [D, E]` as one 2-D matmul over the rows.

Every projection of the Transformer (W^Q, W^K, W^V, W^O of §3.2.2, the two
maps of §3.3, the pre-softmax projection of §3.4) acts on each position
separately, so it can multiply the `[B*T, D]` rows at once. Written that
way rather than as `keras.ops.matmul` of a rank-3 tensor, which TensorFlow
runs as `tf.tensordot`: that reads the input's shape at run time with about
ten small ops around each matmul. In a decoding step -- a while loop of
about a thousand ops per step on small batches -- those ops are a cost of
their own; here a shape known but for one axis needs none (`leading_shape`).
A 2-D matmul is also what TensorFlow's oneDNN rewrite fuses with a bias and
ReLU.
"""

from keras import ops


def leading_shape(x, merged_axes=1):
    """`x`'s shape without its last `merged_axes` axes, as a reshape target.

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


def position_wise_matmul(x, kernel, merged_axes=1):
    """`x [..., D] @ kernel [D, E] -> [..., E]`, as one matmul of the rows `[prod(...), D]`.

    `merged_axes`: how many trailing axes of `x` make up D (2 for the heads
    of a `[B, T, N, H]` attention output, D = N*H).
    """
    if len(x.shape) == 2 and merged_axes == 1:
        return ops.matmul(x, kernel)
    rows = ops.reshape(x, (-1, kernel.shape[0]))
    return ops.reshape(ops.matmul(rows, kernel), leading_shape(x, merged_axes) + (kernel.shape[-1],))
