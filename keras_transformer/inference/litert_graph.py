"""From a traced TensorFlow function to a LiteRT flatbuffer with builtin ops and tensorflow-text's only.

LiteRT's converter legalizes almost all of the translator's graph, with one
gap: a slice that inserts an axis (`x[:, None]`, a `StridedSlice` with a
`new_axis_mask`) becomes a builtin only when the input has at most one
dimension of unknown size, since the converter turns it into a reshape to a
constant shape. The attention masks (`[B, 1, T, S]` from `[B, T, S]`) and the
search's ancestry mask have two or three, and the converter would keep such
slices as TensorFlow ops (the Flex delegate). `expand_new_axes` rewrites them
in the frozen graph as what they are: a reshape of the input to its own shape
with the new axes of size 1 inserted (computed at run time), then the same
slice without new axes. Nothing else of the graph changes.

`convert` freezes the function, rewrites it, saves it as a SavedModel with
one signature and converts that (so the flatbuffer keeps the signature's
input and output names), allowing builtins and custom ops only; it then
refuses any custom op that is not tensorflow-text's, so that no TensorFlow
op slips through as a "custom op" no runtime has.
"""

from __future__ import annotations

import os
import tempfile

import tensorflow as tf

# The custom ops a LiteRT translator may contain: tensorflow-text's, registered by
# `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`.
TFTEXT_OP_PREFIX = "TFText>"


def convert(functions, quantize=None):
    """The LiteRT flatbuffer (bytes) of `tf.function`s' concrete functions, one signature each.

    Args:
        functions: `{signature name: concrete function}`, each with named
            inputs and a dict of outputs.
        quantize: None (float32 weights) or "int8": LiteRT's post-training
            dynamic-range quantization (int8 weights; activations float, each
            matrix product quantizing its input on the fly).

    Raises:
        ValueError: the flatbuffer would need an op LiteRT cannot run (its
            name is in the message).
    """
    module, signatures = tf.Module(), {}
    for index, (name, concrete_function) in enumerate(functions.items()):
        serve = _serving_function(concrete_function, suffix=f"_litert{index}")
        setattr(module, f"signature_{index}", serve)
        signatures[name] = serve.get_concrete_function()
    with tempfile.TemporaryDirectory(prefix="keras_transformer_litert_") as work_dir:
        path = os.path.join(work_dir, "saved_model")
        # The layer norms' custom gradients are of no use here, and tracing them fails on the imported graph.
        options = tf.saved_model.SaveOptions(experimental_custom_gradients=False)
        tf.saved_model.save(module, path, signatures=signatures, options=options)
        converter = tf.lite.TFLiteConverter.from_saved_model(path, signature_keys=list(signatures))
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.allow_custom_ops = True  # tensorflow-text's; any other is refused below
        if quantize == "int8":
            converter.optimizations = [tf.lite.Optimize.DEFAULT]
        elif quantize is not None:
            raise ValueError(f"quantize must be None or 'int8', got {quantize!r}.")
        flatbuffer = converter.convert()
    foreign = sorted(name for name in operator_counts(flatbuffer) if _is_foreign(name))
    if foreign:
        raise ValueError(
            f"LiteRT cannot run the converted translator: it needs the TensorFlow ops {', '.join(foreign)}."
        )
    return flatbuffer


def operator_counts(flatbuffer):
    """`{op name: count}` of a LiteRT flatbuffer, over all its subgraphs; custom ops as "CUSTOM:<name>"."""
    from keras_transformer import compat

    counts = {}
    for name in compat.tflite_operator_names(flatbuffer):
        counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def _is_foreign(name):
    return name.startswith("CUSTOM:") and not name.startswith("CUSTOM:" + TFTEXT_OP_PREFIX)


def _serving_function(concrete_function, suffix):
    """A `tf.function` of the concrete function's inputs, returning the dict `rewritten_function` computes."""
    function = rewritten_function(concrete_function, suffix)

    def serve(*args):
        return dict(function(*args))

    return tf.function(serve, input_signature=_input_signature(concrete_function), autograph=False)


def _input_signature(concrete_function):
    """The function's own inputs (not the variables it captures), as named `TensorSpec`s."""
    return tf.nest.flatten(concrete_function.structured_input_signature)


# The graph rewrite ------------------------------------------------------------------------


def rewritten_function(concrete_function, suffix="_litert"):
    """`concrete_function` frozen, with `expand_new_axes` applied: a function of the same inputs and outputs.

    `suffix` is appended to the names of the graph's functions, which must not clash with those TensorFlow holds.
    """
    from keras_transformer import compat

    frozen = compat.frozen_function(concrete_function)
    graph_def = frozen.graph.as_graph_def()
    expand_new_axes(graph_def)
    _rename_functions(graph_def, suffix)
    inputs = [t.name for t in frozen.inputs]
    outputs = tf.nest.pack_sequence_as(concrete_function.structured_outputs, [t.name for t in frozen.outputs])
    wrapped = tf.compat.v1.wrap_function(lambda: tf.graph_util.import_graph_def(graph_def, name=""), [])
    feeds = [wrapped.graph.as_graph_element(name) for name in inputs]
    return wrapped.prune(feeds, tf.nest.map_structure(wrapped.graph.as_graph_element, outputs))


def expand_new_axes(graph_def):
    """Rewrites the `StridedSlice`s of `graph_def` and its functions that LiteRT cannot run as builtins, or
    only as version 6 of its slice (which its reference kernels lack). Each computes what it computed.

    - New axes (and no ellipsis): `x[spec]` with new axes at spec positions P
      becomes `reshape(x, shape(x) with 1 inserted at P)[spec']`, where spec'
      takes the whole of each inserted axis in place of the new axis (the
      converter's own rewrite, with a shape computed at run time instead of a
      constant one).
    - A leading ellipsis (`x[..., a:b]`, m entries after it): `x` is reshaped
      to `[prod(leading dims), last m dims]`, sliced with the ellipsis taking
      that first axis whole, and reshaped back to the leading dims.

    Returns:
        The number of slices rewritten.
    """
    count = _rewrite_slices(graph_def.node, _graph_output)
    for function in graph_def.library.function:
        count += _rewrite_slices(function.node_def, _function_output)
    return count


def _graph_output(name):
    return name


def _function_output(name):
    # Inside a FunctionDef, an op's output is named by its output argument; all ops added here call it "output".
    return f"{name}:output:0"


def _rewrite_slices(nodes, output):
    added, count = [], 0
    by_name = {node.name: node for node in nodes}
    for node in list(nodes):
        if node.op != "StridedSlice":
            continue
        if node.attr["new_axis_mask"].i and not node.attr["ellipsis_mask"].i:
            _expand_new_axes(node, added, output)
            count += 1
        elif node.attr["ellipsis_mask"].i == 1 and not node.attr["new_axis_mask"].i:
            entries = _vector_length(by_name.get(node.input[1].split(":")[0]))
            if entries and entries > 1:
                _expand_leading_ellipsis(node, entries - 1, added, output)
                count += 1
    for node in added:
        nodes.add().CopyFrom(node)
    return count


def _expand_new_axes(node, added, output):
    mask = node.attr["new_axis_mask"].i
    base = node.name + "/litert_new_axes"
    shape = _node(added, base + "/shape", "Shape", [node.input[0]], T=node.attr["T"], out_type=_INT32)
    pieces, start = [], 0
    for inserted, position in enumerate(p for p in range(64) if mask >> p & 1):
        end = position - inserted  # the input's dimensions before this new axis
        if end > start:
            pieces.append(_dimensions(added, f"{base}/dims_{inserted}", output(shape), start, end, output))
        pieces.append(output(_const(added, f"{base}/one_{inserted}", [1])))
        start = end
    pieces.append(_dimensions(added, f"{base}/dims_rest", output(shape), start, None, output))
    revised = _concat(added, base + "/revised", pieces, output)
    reshaped = _node(added, base + "/reshape", "Reshape", [node.input[0], revised], T=node.attr["T"], Tshape=_INT32)
    node.input[0] = output(reshaped)
    node.attr["begin_mask"].i |= mask
    node.attr["end_mask"].i |= mask
    node.attr["new_axis_mask"].i = 0


def _expand_leading_ellipsis(node, tail, added, output):
    """`x[..., s_1, ..., s_tail]` as reshapes around `x'[:, s_1, ..., s_tail]` (see `expand_new_axes`)."""
    base, dtype = node.name + "/litert_ellipsis", node.attr["T"]
    source = node.input[0]
    shape = output(_node(added, base + "/shape", "Shape", [source], T=dtype, out_type=_INT32))
    leading = _dimensions(added, base + "/leading", shape, 0, -tail, output)
    rows = _node(
        added,
        base + "/rows",
        "Prod",
        [leading, output(_const(added, base + "/axis0", [0]))],
        T=_INT32,
        Tidx=_INT32,
        keep_dims=True,
    )
    trailing = _dimensions(added, base + "/trailing", shape, -tail, None, output)
    flat = _node(
        added,
        base + "/flat",
        "Reshape",
        [source, _concat(added, base + "/flat_shape", [output(rows), trailing], output)],
        T=dtype,
        Tshape=_INT32,
    )
    sliced = tf.compat.v1.NodeDef()
    sliced.CopyFrom(node)
    sliced.name = base + "/sliced"
    sliced.input[0] = output(flat)
    sliced.attr["ellipsis_mask"].i = 0
    sliced.attr["begin_mask"].i |= 1
    sliced.attr["end_mask"].i |= 1
    added.append(sliced)
    sliced_shape = output(
        _node(added, base + "/sliced_shape", "Shape", [output(sliced.name)], T=dtype, out_type=_INT32)
    )
    kept = _dimensions(added, base + "/kept", sliced_shape, 1, None, output)
    final_shape = _concat(added, base + "/final_shape", [leading, kept], output)
    # The node keeps its name, so that what read the slice reads the reshape.
    node.op = "Reshape"
    del node.input[:]
    node.input.extend([output(sliced.name), final_shape])
    node.attr.clear()
    node.attr["T"].CopyFrom(dtype)
    node.attr["Tshape"].type = _INT32


def _vector_length(node):
    """The length of the 1-D vector a `Const` or `Pack` node makes, or None."""
    if node is None:
        return None
    if node.op == "Const" and len(node.attr["value"].tensor.tensor_shape.dim) == 1:
        return node.attr["value"].tensor.tensor_shape.dim[0].size
    if node.op == "Pack":
        return node.attr["N"].i
    return None


_INT32 = tf.int32.as_datatype_enum


def _concat(added, name, pieces, output):
    """A node concatenating int32 vectors; returns its output name."""
    axis = output(_const(added, name + "/axis", 0))
    return output(_node(added, name, "ConcatV2", pieces + [axis], T=_INT32, N=len(pieces), Tidx=_INT32))


def _dimensions(added, name, shape, start, end, output):
    """A node slicing `shape[start:end]` (`end` None: to the end); returns its output name."""
    begin, stop = _const(added, name + "/begin", [start]), _const(added, name + "/end", [end or 0])
    stride = _const(added, name + "/stride", [1])
    inputs = [shape, output(begin), output(stop), output(stride)]
    masks = dict(begin_mask=0, end_mask=int(end is None), ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0)
    return output(_node(added, name, "StridedSlice", inputs, T=_INT32, Index=_INT32, **masks))


def _const(added, name, value):
    tensor = tf.make_tensor_proto(value, tf.int32)
    return _node(added, name, "Const", [], dtype=tf.int32.as_datatype_enum, value=tensor)


def _node(added, name, op, inputs, **attrs):
    """Appends a `NodeDef` to `added` and returns its name. Attribute values: bools, ints (dtype enums for type
    attributes named T, Tidx, Tshape, Index, out_type, dtype), `AttrValue`s, or a `TensorProto` for "value"."""
    node = tf.compat.v1.NodeDef(name=name, op=op, input=inputs)
    for key, value in attrs.items():
        if isinstance(value, tf.compat.v1.AttrValue):
            node.attr[key].CopyFrom(value)
        elif isinstance(value, bool):
            node.attr[key].b = value
        elif key == "value":
            node.attr[key].tensor.CopyFrom(value)
        elif key in ("T", "Tidx", "Tshape", "Index", "out_type", "dtype"):
            node.attr[key].type = value
        else:
            node.attr[key].i = value
    added.append(node)
    return name


def _rename_functions(graph_def, suffix):
    """Renames every function of `graph_def`'s library, and every reference to one (call ops, function attributes)."""
    names = {f.signature.name: f.signature.name + suffix for f in graph_def.library.function}
    for function in graph_def.library.function:
        function.signature.name = names[function.signature.name]
    for gradient in graph_def.library.gradient:
        gradient.function_name = names.get(gradient.function_name, gradient.function_name)

    def rename(nodes):
        for node in nodes:
            node.op = names.get(node.op, node.op)
            for attr in node.attr.values():
                if attr.HasField("func"):
                    attr.func.name = names.get(attr.func.name, attr.func.name)
                for function in attr.list.func:
                    function.name = names.get(function.name, function.name)

    rename(graph_def.node)
    for function in graph_def.library.function:
        rename(function.node_def)
