"""Layers against the paper's formulas, computed independently in NumPy."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_transformer.layers import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LearnedPositionalEmbedding,
    MultiHeadAttention,
    PositionalEncoding,
    SharedEmbedding,
    sinusoidal_encoding,
)


def numpy_multi_head_attention(layer, query, memory, mask=None):
    """Equation (1) and MultiHead of §3.2.2 from the layer's own weights."""
    wq, wk, wv, wo = (
        np.asarray(w) for w in (layer.query_kernel, layer.key_kernel, layer.value_kernel, layer.output_kernel)
    )
    n, dk, dv = layer.num_heads, layer.key_dim, layer.value_dim
    bq, bk, bv, bo = (
        (np.asarray(b) for b in (layer.query_bias, layer.key_bias, layer.value_bias, layer.output_bias))
        if layer.use_bias
        else (np.zeros(n * dk), np.zeros(n * dk), np.zeros(n * dv), 0.0)
    )
    heads = []
    for i in range(n):
        q = query @ wq[:, i * dk : (i + 1) * dk] + bq[i * dk : (i + 1) * dk]
        k = memory @ wk[:, i * dk : (i + 1) * dk] + bk[i * dk : (i + 1) * dk]
        v = memory @ wv[:, i * dv : (i + 1) * dv] + bv[i * dv : (i + 1) * dv]
        logits = q @ np.swapaxes(k, -1, -2) / math.sqrt(dk)
        if mask is not None:
            logits = np.where(mask, logits, -np.inf)
        weights = np.exp(logits - logits.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        heads.append(weights @ v)
    return np.concatenate(heads, axis=-1) @ wo + bo


@pytest.mark.parametrize("masked", [False, True])
def test_self_attention_equals_numpy_formula(masked):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 5, 16)).astype("float32")
    layer = MultiHeadAttention(num_heads=4, key_dim=4)
    mask = None
    if masked:
        # Padding on keys of the 2nd sentence and a causal pattern.
        padding = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)[:, None, :]
        causal = np.tril(np.ones((5, 5), bool))[None]
        mask = padding & causal
    got = layer(x, attention_mask=mask)
    np.testing.assert_allclose(got, numpy_multi_head_attention(layer, x, x, mask), atol=1e-5)


def test_attention_with_biases_equals_numpy_formula():
    # The scale 1/sqrt(d_k) applies to the query's bias too (it is folded into W^Q and b^Q).
    rng = np.random.default_rng(3)
    query = rng.normal(size=(2, 3, 12)).astype("float32")
    memory = rng.normal(size=(2, 5, 12)).astype("float32")
    layer = MultiHeadAttention(num_heads=3, key_dim=3, use_bias=True)
    layer(query, memory)
    for bias in (layer.query_bias, layer.key_bias, layer.value_bias, layer.output_bias):
        bias.assign(rng.normal(size=bias.shape).astype("float32"))
    np.testing.assert_allclose(layer(query, memory), numpy_multi_head_attention(layer, query, memory), atol=1e-5)
    np.testing.assert_allclose(layer(query), numpy_multi_head_attention(layer, query, query), atol=1e-5)


def test_causal_flag_equals_explicit_causal_mask():
    x = np.random.default_rng(1).normal(size=(2, 6, 8)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    explicit = layer(x, attention_mask=np.tril(np.ones((6, 6), bool))[None])
    np.testing.assert_allclose(layer(x, use_causal_mask=True), explicit, atol=1e-6)


def test_cross_attention_with_different_value_dim_and_padding():
    rng = np.random.default_rng(2)
    query = rng.normal(size=(2, 3, 12)).astype("float32")
    memory = rng.normal(size=(2, 7, 10)).astype("float32")
    layer = MultiHeadAttention(num_heads=3, key_dim=5, value_dim=2)
    mask = np.array([[1] * 7, [1] * 4 + [0] * 3], bool)[:, None, :]
    got, weights, _ = layer.attend(query, memory, attention_mask=mask)
    assert got.shape == (2, 3, 12)
    assert weights.shape == (2, 3, 3, 7)
    np.testing.assert_allclose(got, numpy_multi_head_attention(layer, query, memory, mask), atol=1e-5)
    # Padded keys get exactly zero weight; each row sums to one.
    assert np.all(np.asarray(weights)[1, :, :, 4:] == 0)
    np.testing.assert_allclose(np.asarray(weights).sum(-1), 1.0, atol=1e-6)


def test_attention_scaled_by_inverse_sqrt_key_dim():
    """The softmax logits are q.k / sqrt(d_k), d_k one head's key width: not sqrt(h * d_k), nor sqrt(d_model)."""
    # Two heads of d_k = 2 on d_model = 8, so 1/sqrt(d_k), 1/sqrt(h * d_k) and 1/sqrt(d_model) all differ.
    # W^Q and W^K pass features 0-1 to head 0 and features 2-3 to head 1; two keys.
    num_heads, key_dim, d_model = 2, 2, 8
    layer = MultiHeadAttention(num_heads=num_heads, key_dim=key_dim)
    x = np.zeros((1, 2, d_model), "float32")
    x[0, 0, [0, 2]] = [2.0, 1.0]
    x[0, 1, [1, 3]] = [3.0, 2.0]
    layer.build((1, 2, d_model))
    feature_selection = np.eye(d_model, num_heads * key_dim, dtype="float32")
    for kernel in (layer.query_kernel, layer.key_kernel, layer.value_kernel):
        kernel.assign(feature_selection)
    layer.output_kernel.assign(feature_selection.T)
    weights = layer.attend(x).weights
    # Query 0: head 0 q.k0 = 4, q.k1 = 0; head 1 q.k0 = 1, q.k1 = 0; sqrt(d_k) = sqrt(2).
    logits = np.array([[4.0, 0.0], [1.0, 0.0]]) / math.sqrt(key_dim)
    expected = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(np.asarray(weights)[0, :, 0], expected, atol=1e-6)  # [B, N, T, S]: both heads


@pytest.mark.parametrize("jit_compile", [False, True])
def test_bfloat16_attention_weights_are_a_float32_softmax_rounded_once(jit_compile):
    """Under mixed_bfloat16 each weight is the exact softmax of equation (1) rounded once to bfloat16 (within half
    a bfloat16 step): the softmax runs in float32. Under XLA a bfloat16 softmax would run in bfloat16 and miss by
    up to twice that on these 2,000 keys (TensorFlow's own kernel computes in float32 either way)."""
    rng = np.random.default_rng(0)
    layer = MultiHeadAttention(num_heads=1, key_dim=4, use_bias=False, dtype="mixed_bfloat16")
    layer.build((1, 3, 4))
    for kernel in (layer.query_kernel, layer.key_kernel):
        kernel.assign(np.eye(4, dtype="float32"))  # logits q.k / 2 of small integers: exact in bfloat16
    query = rng.integers(-2, 3, size=(1, 3, 4)).astype("float32")
    memory = rng.integers(-2, 3, size=(1, 2000, 4)).astype("float32")
    attend = tf.function(lambda q, m: layer.attend(q, m).weights, jit_compile=jit_compile)
    weights = np.asarray(ops.cast(attend(query, memory), "float32"), "float64")[0, 0]
    logits = query[0].astype("float64") @ memory[0].T.astype("float64") / 2
    exact = np.exp(logits - logits.max(axis=-1, keepdims=True))
    exact /= exact.sum(axis=-1, keepdims=True)
    half_step = 2.0 ** (np.floor(np.log2(exact)) - 8)  # bfloat16 keeps 8 significant bits
    assert np.all(np.abs(weights - exact) <= half_step * (1 + 1e-3))


def test_self_attention_cache_equals_full_pass():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    full = layer(x, use_causal_mask=True)
    cache = layer.init_cache(2, 6)
    outputs = []
    for t in range(6):
        out, _, cache = layer.attend(x[:, t : t + 1], use_causal_mask=True, cache=cache, cache_index=t)
        outputs.append(out)
    np.testing.assert_allclose(np.concatenate(outputs, 1), full, atol=1e-5)
    # Two steps at once from the middle also agree.
    cache = layer.init_cache(2, 6)
    cache = layer.attend(x[:, :4], use_causal_mask=True, cache=cache, cache_index=0).cache
    out = layer(x[:, 4:], use_causal_mask=True, cache=cache, cache_index=4)
    np.testing.assert_allclose(out, np.asarray(full)[:, 4:], atol=1e-5)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_cache_write_slices_under_xla_and_concatenates_in_plain_graphs(jit_compile):
    rng = np.random.default_rng(4)
    cache = rng.normal(size=(2, 3, 6, 4)).astype("float32")
    update = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    expected = cache.copy()
    expected[:, :, 3:5] = update
    write = tf.function(MultiHeadAttention._write_cache, jit_compile=jit_compile)
    np.testing.assert_array_equal(write(cache, update, tf.constant(3)), expected)
    graph = write.get_concrete_function(cache, update, tf.constant(3)).graph
    op_types = {op.type for op in graph.get_operations()}
    # A plain graph (what a SavedModel holds for TF Serving) must not need XLA ops.
    assert ("XlaDynamicUpdateSlice" in op_types) == jit_compile
    assert ("ConcatV2" in op_types) != jit_compile
    assert "TensorScatterUpdate" not in op_types


def test_growing_self_attention_cache_equals_full_pass():
    """Outside XLA a cache of exactly `cache_index` positions grows: decoding can start from an empty one."""

    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    full = np.asarray(layer(x, use_causal_mask=True))

    @tf.function(autograph=False)  # a plain graph, as in a SavedModel
    def step(inputs, cache, index):
        result = layer.attend(inputs, use_causal_mask=True, cache=cache, cache_index=index)
        return result.output, result.cache

    cache = layer.init_cache(2, 0)
    _, cache = step(x[:, :2], cache, tf.constant(0))  # two steps at once, then one by one
    assert cache[0].shape == (2, 2, 2, 4)
    outputs = []
    for t in range(2, 5):
        out, cache = step(x[:, t : t + 1], cache, tf.constant(t))
        outputs.append(out)
    assert cache[0].shape == (2, 2, 5, 4) and cache[1].shape == (2, 2, 5, 4)
    np.testing.assert_allclose(np.concatenate(outputs, 1), full[:, 2:], atol=1e-5)


def test_xla_cache_write_without_room_is_refused():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.zeros((1, 2, 8), "float32")
    layer(x)

    @tf.function(jit_compile=True)
    def step(inputs):
        return layer(inputs, use_causal_mask=True, cache=layer.init_cache(1, 3), cache_index=2)

    with pytest.raises(ValueError, match="no room for positions 2..3"):
        step(x)


@pytest.mark.parametrize("index", [-1, 5, 9])
def test_xla_cache_write_out_of_range_at_a_tensor_index_poisons_the_rows(index):
    """Dynamic-update-slice would clamp the write to the cache's end; asserts do not run under XLA."""

    rng = np.random.default_rng(7)
    cache = rng.normal(size=(2, 3, 6, 4)).astype("float32")
    update = rng.normal(size=(2, 3, 2, 4)).astype("float32")
    write = tf.function(MultiHeadAttention._write_cache, jit_compile=True)
    written = np.asarray(write(cache, update, tf.constant(index)))
    assert np.isnan(written).any()
    assert not np.isin(update, written).any()  # the update is nowhere as it was
    fits = np.asarray(write(cache, update, tf.constant(4)))  # the last two rows: room exactly
    expected = cache.copy()
    expected[:, :, 4:] = update
    np.testing.assert_array_equal(fits, expected)


def test_xla_self_attention_past_the_cache_end_at_a_tensor_index_gives_nan():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.random.default_rng(8).normal(size=(1, 2, 8)).astype("float32")
    layer(x)

    @tf.function(jit_compile=True)
    def step(inputs, index):
        result = layer.attend(inputs, use_causal_mask=True, cache=layer.init_cache(1, 3), cache_index=index)
        return result.output, result.cache

    out, (keys, values) = step(x, tf.constant(2))  # positions 2..3 of a 3-position cache
    assert np.isnan(np.asarray(out)).all()
    assert np.isnan(np.asarray(keys)).any() and np.isnan(np.asarray(values)).any()
    out, _ = step(x, tf.constant(1))  # positions 1..2 fit
    assert np.isfinite(np.asarray(out)).all()
    expected = layer(x, use_causal_mask=True, cache=layer.init_cache(1, 3), cache_index=1)  # eager
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_positional_encoding_equals_paper_formula_at_any_length():
    d_model, length = 10, 3000  # far longer than any fixed table
    table = np.asarray(sinusoidal_encoding(np.arange(length), d_model))
    pos = np.arange(length)[:, None]
    i = np.arange(d_model // 2)[None, :]
    np.testing.assert_allclose(table[:, 0::2], np.sin(pos / 10000 ** (2 * i / d_model)), atol=2e-4)
    np.testing.assert_allclose(table[:, 1::2], np.cos(pos / 10000 ** (2 * i / d_model)), atol=2e-4)
    layer = PositionalEncoding()
    x = np.ones((2, 5, d_model), "float32")
    np.testing.assert_allclose(layer(x), np.broadcast_to(1.0 + table[None, :5], x.shape), atol=1e-6)
    np.testing.assert_allclose(layer(x[:, :2], start_index=3)[0], 1.0 + table[3:5], atol=1e-6)


def test_learned_positions_reject_too_long_inputs():
    layer = LearnedPositionalEmbedding(max_length=4)
    assert layer(np.zeros((1, 4, 6), "float32")).shape == (1, 4, 6)
    with pytest.raises(ValueError, match="max_length=4"):
        layer(np.zeros((1, 5, 6), "float32"))


def test_shared_embedding_scales_and_projects_with_one_matrix():
    layer = SharedEmbedding(vocab_size=11, d_model=4)
    ids = np.array([[1, 2, 0]])
    vectors = np.asarray(layer(ids))
    table = np.asarray(layer.embeddings)
    np.testing.assert_allclose(vectors, table[ids] * 2.0, atol=1e-6)  # sqrt(4) = 2
    x = np.random.default_rng(4).normal(size=(1, 3, 4)).astype("float32")
    np.testing.assert_allclose(layer.project(x), x @ table.T, atol=1e-5)
    assert len(layer.weights) == 1


def test_shared_embedding_gathers_from_float32_table_under_mixed_precision():
    """The lookup reads the float32 matrix and rounds once: each row is the float32 row times sqrt(d_model),
    cast to bfloat16. A gather from a bfloat16 copy (Keras' autocast) rounds the table and the scale first,
    which changes values when sqrt(d_model) is not a power of two."""
    layer = SharedEmbedding(vocab_size=11, d_model=128, dtype="mixed_bfloat16")
    ids = np.arange(11)[None]
    out = layer(ids)
    assert layer.embeddings.dtype == "float32"
    assert out.dtype == "bfloat16"
    rounded_once = ops.cast(np.asarray(layer.embeddings)[ids] * np.float32(math.sqrt(128)), "bfloat16")
    np.testing.assert_array_equal(np.asarray(ops.cast(out, "float32")), np.asarray(ops.cast(rounded_once, "float32")))
    assert layer.project(out).dtype == "bfloat16"


def test_shared_embedding_keeps_float_token_ids_exact_under_mixed_precision():
    """Ids that arrive as floats (Keras builds models from float placeholders) are not cast to bfloat16
    first: bfloat16 holds integers exactly only up to 256, so id 7999 would become 8000 and 3001 become 3008."""
    layer = SharedEmbedding(vocab_size=8000, d_model=8, scale=False, dtype="mixed_bfloat16")
    ids = np.array([[7999, 3001, 257, 5]])
    out = layer(ids.astype("float32"))
    expected = ops.cast(np.asarray(layer.embeddings)[ids], "bfloat16")
    np.testing.assert_array_equal(np.asarray(ops.cast(out, "float32")), np.asarray(ops.cast(expected, "float32")))


def test_feed_forward_is_relu_sandwich():
    layer = FeedForward(d_ff=6)
    x = np.random.default_rng(5).normal(size=(2, 3, 4)).astype("float32")
    out = np.asarray(layer(x))
    w1, b1 = (np.asarray(w) for w in (layer.inner.kernel, layer.inner.bias))
    w2, b2 = (np.asarray(w) for w in (layer.outer.kernel, layer.outer.bias))
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (2, 3, 2, 4), (1, 0, 4)], ids=str)
def test_feed_forward_applies_to_each_position_of_any_rank(shape):
    """§3.3: the same two maps at every position, whatever the leading axes (rows are flattened for the matmuls)."""
    layer = FeedForward(d_ff=6, output_dim=3)
    x = np.random.default_rng(7).normal(size=shape).astype("float32")
    out = np.asarray(layer(x))
    assert out.shape == shape[:-1] + (3,)
    w1, b1 = (np.asarray(w) for w in (layer.inner.kernel, layer.inner.bias))
    w2, b2 = (np.asarray(w) for w in (layer.outer.kernel, layer.outer.bias))
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


def test_feed_forward_keeps_unknown_leading_axes_in_a_graph():
    layer = FeedForward(d_ff=6)
    layer.build((None, None, 4))
    traced = tf.function(layer, input_signature=[tf.TensorSpec([None, None, 4])])
    assert traced.get_concrete_function().structured_outputs.shape.as_list() == [None, None, 4]
    x = np.random.default_rng(8).normal(size=(3, 5, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(traced(x)), np.asarray(layer(x)), atol=1e-6)


SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "Prod"}  # tf.tensordot's among them


def test_attention_heads_are_split_without_shape_ops_in_a_decoding_step():
    """`[B, K, D]` queries (B unknown) go through the projections, the head split and W^O without shape ops."""

    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    layer.build((None, 4, 8), (None, 5, 8))
    memory = tf.constant(np.random.default_rng(13).normal(size=(3, 5, 8)).astype("float32"))
    cache = layer.compute_key_value(memory)
    traced = tf.function(lambda q: layer(q, memory, cache=cache), input_signature=[tf.TensorSpec([None, 4, 8])])
    op_types = {op.type for op in traced.get_concrete_function().graph.get_operations()}
    assert not op_types & SHAPE_OPS, op_types & SHAPE_OPS
    query = np.random.default_rng(14).normal(size=(3, 4, 8)).astype("float32")
    np.testing.assert_allclose(traced(query), layer(query, memory), atol=1e-5)


def _randomize_layer_norms(layer, rng):
    """Gives every LayerNorm of `layer` its own random gamma and beta, so that a formula test sees which
    LayerNorm is applied where, and that its parameters are (fresh ones are 1 and 0)."""
    for norm in (sub for sub in layer._flatten_layers() if isinstance(sub, keras.layers.LayerNormalization)):
        norm.gamma.assign(rng.uniform(0.5, 1.5, norm.gamma.shape).astype("float32"))
        norm.beta.assign(rng.normal(size=norm.beta.shape).astype("float32"))


def _layer_norm(norm):
    """The numpy form of the LayerNormalization `norm`, with its gamma and beta."""
    gamma, beta = np.asarray(norm.gamma), np.asarray(norm.beta)

    def normalize(v):
        mean, var = v.mean(-1, keepdims=True), v.var(-1, keepdims=True)
        return (v - mean) / np.sqrt(var + 1e-6) * gamma + beta

    return normalize


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_post_ln_and_pre_ln_encoder_layers_follow_their_formulas(norm_first):
    """§3.1: LayerNorm(x + Sublayer(x)) for each sublayer, each with its own LayerNorm (or pre-LN's
    x + Sublayer(LayerNorm(x)))."""
    rng = np.random.default_rng(6)
    x = rng.normal(size=(2, 4, 8)).astype("float32")
    layer = EncoderLayer(num_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    layer.build(x.shape)
    _randomize_layer_norms(layer, rng)
    out = np.asarray(layer(x))
    attention = lambda v: np.asarray(layer.self_attention(v))  # noqa: E731
    ffn = lambda v: np.asarray(layer.feed_forward(v))  # noqa: E731
    norm_1 = _layer_norm(layer.self_attention_connection.layer_norm)
    norm_2 = _layer_norm(layer.feed_forward_connection.layer_norm)
    if norm_first:
        h = x + attention(norm_1(x))
        expected = h + ffn(norm_2(h))
    else:
        h = norm_1(x + attention(x))
        expected = norm_2(h + ffn(h))
    np.testing.assert_allclose(out, expected, atol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_post_ln_and_pre_ln_decoder_layers_follow_their_formulas(norm_first):
    """§3.1: masked self-attention, encoder-decoder attention on the memory, then the feed-forward, each in
    its own residual connection and LayerNorm."""
    rng = np.random.default_rng(7)
    x, memory = rng.normal(size=(2, 4, 8)).astype("float32"), rng.normal(size=(2, 5, 8)).astype("float32")
    layer = DecoderLayer(num_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    layer.build(x.shape, memory.shape)
    _randomize_layer_norms(layer, rng)
    out = np.asarray(layer(x, memory, use_causal_mask=True))
    masked = lambda v: np.asarray(layer.self_attention(v, use_causal_mask=True))  # noqa: E731
    cross = lambda v: np.asarray(layer.cross_attention(v, memory))  # noqa: E731
    ffn = lambda v: np.asarray(layer.feed_forward(v))  # noqa: E731
    connections = (layer.self_attention_connection, layer.cross_attention_connection, layer.feed_forward_connection)
    norms = [_layer_norm(connection.layer_norm) for connection in connections]
    h = x
    for sublayer, norm in zip((masked, cross, ffn), norms):
        h = h + sublayer(norm(h)) if norm_first else norm(h + sublayer(h))
    np.testing.assert_allclose(out, h, atol=1e-4)


@pytest.mark.parametrize("norm_first", [False, True], ids=["post_ln", "pre_ln"])
def test_stacks_apply_their_layers_in_turn_then_pre_ln_s_final_norm(norm_first):
    """§3.1: a stack is its N layers applied in turn. Pre-LN ends with a LayerNorm of its own (Xiong et al., 2020),
    since its layers' outputs are not normalized; post-LN has none."""
    rng = np.random.default_rng(8)
    x, memory = rng.normal(size=(2, 4, 8)).astype("float32"), rng.normal(size=(2, 5, 8)).astype("float32")
    encoder = Encoder(num_layers=2, num_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    encoder.build(x.shape)
    decoder = Decoder(num_layers=2, num_heads=2, d_ff=16, dropout=0.0, norm_first=norm_first)
    decoder.build(x.shape, memory.shape)
    expected_encoder, expected_decoder = x, x
    for layer in encoder.encoder_layers:
        expected_encoder = np.asarray(layer(expected_encoder))
    for layer in decoder.decoder_layers:
        expected_decoder = np.asarray(layer(expected_decoder, memory, use_causal_mask=True))
    assert (encoder.final_norm is not None, decoder.final_norm is not None) == (norm_first, norm_first)
    if norm_first:
        for stack in (encoder, decoder):
            _randomize_layer_norms(stack.final_norm, rng)
        expected_encoder = _layer_norm(encoder.final_norm)(expected_encoder)
        expected_decoder = _layer_norm(decoder.final_norm)(expected_decoder)
    np.testing.assert_allclose(np.asarray(encoder(x)), expected_encoder, atol=1e-4)
    np.testing.assert_allclose(np.asarray(decoder(x, memory)), expected_decoder, atol=1e-4)


def test_encoder_padding_mask_from_keras_mask():
    embedding = keras.layers.Embedding(20, 8, mask_zero=True)
    encoder = Encoder(num_layers=1, num_heads=2, d_ff=16, dropout=0.0)
    ids = np.array([[3, 4, 5, 0, 0]])
    via_keras_mask = encoder(embedding(ids))
    explicit = encoder(embedding(ids), padding_mask=ids != 0)
    np.testing.assert_allclose(via_keras_mask, explicit, atol=1e-6)
    # More padding leaves the real positions unchanged.
    longer = np.array([[3, 4, 5, 0, 0, 0, 0]])
    np.testing.assert_allclose(encoder(embedding(longer))[:, :3], explicit[:, :3], atol=1e-5)


def test_encoder_layer_uses_keras_mask_as_padding_mask():
    embedding = keras.layers.Embedding(20, 8, mask_zero=True)
    layer = EncoderLayer(num_heads=2, d_ff=16, dropout=0.0)
    ids = np.array([[3, 4, 5, 0]])
    explicit = layer(embedding(ids), attention_mask=(ids != 0)[:, None, :])
    np.testing.assert_allclose(layer(embedding(ids)), explicit, atol=1e-6)
    assert not np.allclose(layer(embedding(ids), attention_mask=np.ones((1, 1, 4), bool)), explicit)


def test_head_dims_must_divide():
    with pytest.raises(ValueError, match="not divisible by num_heads=3; pass key_dim"):
        EncoderLayer(num_heads=3, d_ff=8)(np.zeros((1, 2, 8), "float32"))
    with pytest.raises(ValueError, match="not divisible by num_heads=3; pass value_dim"):
        EncoderLayer(num_heads=3, d_ff=8, key_dim=2)(np.zeros((1, 2, 8), "float32"))


def test_value_dim_defaults_to_d_model_over_h_in_the_layers():
    """d_v = d_model / h unless given (§3.2.2), not d_k: Table 3 row (B) changes d_k alone."""
    x = np.zeros((1, 3, 16), "float32")
    encoder_layer = EncoderLayer(num_heads=4, d_ff=8, key_dim=2)
    encoder_layer(x)
    decoder = Decoder(num_layers=1, num_heads=4, d_ff=8, key_dim=2, value_dim=None)
    decoder(x, x)
    for attention in (
        encoder_layer.self_attention,
        decoder.decoder_layers[0].self_attention,
        decoder.decoder_layers[0].cross_attention,
    ):
        assert (attention.key_dim, attention.value_dim) == (2, 4)
    layer = EncoderLayer(num_heads=4, d_ff=8, value_dim=3)
    layer(x)
    assert (layer.self_attention.key_dim, layer.self_attention.value_dim) == (4, 3)
    # The standalone layer keeps Keras's convention: it knows no d_model.
    assert MultiHeadAttention(num_heads=4, key_dim=2).value_dim == 2


@pytest.mark.parametrize(
    "layer",
    [
        MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, dropout=0.1, use_bias=True),
        FeedForward(d_ff=7, activation="gelu"),
        SharedEmbedding(vocab_size=9, d_model=4, scale=False),
        LearnedPositionalEmbedding(max_length=12),
        EncoderLayer(num_heads=2, d_ff=8, norm_first=True),
        DecoderLayer(num_heads=2, d_ff=8, key_dim=3),
        Encoder(num_layers=2, num_heads=2, d_ff=8),
        Decoder(num_layers=2, num_heads=2, d_ff=8, activation="gelu"),
    ],
    ids=lambda layer: type(layer).__name__,
)
def test_config_round_trip(layer):
    config = layer.get_config()
    clone = type(layer).from_config(config)
    assert clone.get_config() == config
    restored = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(restored) is type(layer)


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("use_bias", [False, True])
def test_input_projection_computed_beforehand_gives_the_same_output(dtype, use_bias):
    """`input_projection()` built outside `call` (as decoding does, once per search) is what `call` builds itself:
    in the compute dtype, W^Q scaled by 1/sqrt(d_k), and the same outputs for self- and cross-attention."""
    rng = np.random.default_rng(5)
    query = rng.normal(size=(2, 3, 16)).astype("float32")
    memory = rng.normal(size=(2, 5, 16)).astype("float32")
    for self_attention in (True, False):
        layer = MultiHeadAttention(
            num_heads=2, key_dim=6, use_bias=use_bias, bias_initializer="random_normal", dtype=dtype
        )
        key_value = None if self_attention else memory
        expected = layer(query, key_value)
        projection = layer.input_projection(self_attention=self_attention)
        assert all(
            t is None or keras.backend.standardize_dtype(t.dtype) == layer.compute_dtype for t in projection.values()
        )
        assert (projection["bias"] is not None) == use_bias
        width = 2 * 6 * (3 if self_attention else 1)
        assert tuple(projection["kernel"].shape) == (16, width)
        scaled_query = np.asarray(ops.cast(layer.query_kernel, "float32")) / math.sqrt(6)
        np.testing.assert_allclose(
            np.asarray(ops.cast(projection["kernel"][:, :12], "float32")),
            scaled_query,
            rtol=1e-2 if dtype != "float32" else 1e-6,
        )
        np.testing.assert_array_equal(
            np.asarray(ops.cast(layer(query, key_value, projection=projection), "float32")),
            np.asarray(ops.cast(expected, "float32")),
        )


def test_layers_with_extra_outputs_build_functional_models():
    """Symbolic `attend`, `encode` and `decode` return the same structure as eager ones (attention weights)."""
    query, memory = keras.Input((5, 8)), keras.Input((3, 8))
    output, weights, _ = MultiHeadAttention(num_heads=2, key_dim=4).attend(query)
    assert tuple(output.shape) == (None, 5, 8) and tuple(weights.shape) == (None, 2, 5, 5)
    encoded, encoder_weights = Encoder(num_layers=2, num_heads=2, d_ff=16).encode(query)
    assert len(encoder_weights) == 2 and tuple(encoder_weights[0].shape) == (None, 2, 5, 5)
    decoded, _, cross_weights, _ = Decoder(num_layers=1, num_heads=2, d_ff=16).decode(query, memory)
    assert tuple(cross_weights[0].shape) == (None, 2, 5, 3)
    model = keras.Model([query, memory], [output, weights, encoded, decoded])
    outputs = model([np.ones((2, 5, 8), "float32"), np.ones((2, 3, 8), "float32")])
    assert [tuple(o.shape) for o in outputs] == [(2, 5, 8), (2, 2, 5, 5), (2, 5, 8), (2, 5, 8)]


def test_attention_refuses_masks_and_inputs_of_other_ranks():
    layer = MultiHeadAttention(num_heads=2, key_dim=4, name="mha")
    x = np.ones((2, 3, 8), "float32")
    with pytest.raises(ValueError, match=r"mha: attention_mask must be \[B, S\]"):
        layer(x, attention_mask=np.ones((2, 1, 3, 3), bool))
    with pytest.raises(ValueError, match=r"mha: query must be \[B, T, D\], got shape \(3, 8\)"):
        layer(x[0])
    padding = np.array([[True, True, False], [True, False, False]])
    np.testing.assert_allclose(layer(x, attention_mask=padding), layer(x, attention_mask=padding[:, None]), atol=1e-6)


@pytest.mark.parametrize("index", [-1, 5])
def test_growing_cache_refuses_an_index_it_cannot_take(index):
    """A growing cache keeps its rows before cache_index: a gap or a negative index would misplace the keys."""
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.ones((1, 1, 8), "float32")
    layer(x)
    with pytest.raises(ValueError, match="cache_index must be >= 0|cannot take positions from 5"):
        layer(x, use_causal_mask=True, cache=layer.init_cache(1, 4), cache_index=index)


def test_growing_cache_at_a_tensor_index_past_its_end_gives_nan_in_a_graph():
    layer = MultiHeadAttention(num_heads=2, key_dim=4)
    x = np.random.default_rng(3).normal(size=(1, 1, 8)).astype("float32")
    layer(x)
    step = tf.function(lambda index: layer(x, use_causal_mask=True, cache=layer.init_cache(1, 2), cache_index=index))
    assert np.isnan(np.asarray(step(tf.constant(3)))).all()
    assert np.isfinite(np.asarray(step(tf.constant(2)))).all()  # grows the 2 rows by one


def test_learned_positions_past_the_table_give_nan_under_xla():
    """XLA clamps the gather to the last row; NaN shows the broken contract instead."""

    layer = LearnedPositionalEmbedding(max_length=4)
    x = np.zeros((1, 1, 6), "float32")
    layer(x)
    at = tf.function(lambda start: layer(x, start_index=start), jit_compile=True)
    assert np.isnan(np.asarray(at(tf.constant(10)))).all()
    np.testing.assert_allclose(at(tf.constant(3)), np.asarray(layer.position_embeddings)[None, 3:4], atol=1e-6)
