"""Scaled dot-product and multi-head attention (Vaswani et al., 2017, §3.2).

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V                      (1)
    MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O
        where head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)

Shape letters used in comments: B batch, T query length, S key/value length,
N heads, H per-head width (d_k or d_v), D model width.
"""

import math
from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer import compat
from keras_transformer.kernels.matmul import leading_shape, position_wise_matmul
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.initialization import initializer_for_weight

# Added to the logits of masked positions. Finite, so that a row with every key
# masked gives a uniform distribution instead of NaN.
_MASK_LOGIT = -1e9


def in_place_cache_writes():
    """Whether `MultiHeadAttention` writes a self-attention cache in place.

    False only for TensorFlow code that is not being compiled by XLA: there
    the cache is concatenated and may grow (see `_write_cache`), which is
    what beam search relies on to start from an empty cache. (TensorFlow's
    dynamic-update-slice is an XLA op; other backends always have one.)
    """
    return compat.runs_with_xla_semantics()


class AttentionOutput(NamedTuple):
    """What `MultiHeadAttention.attend` returns.

    Attributes:
        output: `[B, T, output_dim]`, what `MultiHeadAttention.call` returns.
        weights: the attention weights `[B, N, T, S]` (softmax of equation (1)).
        cache: the updated self-attention cache `(keys, values)`, the
            cross-attention cache given, or None without a cache.
    """

    output: Any
    weights: Any
    cache: Any


def causal_mask(query_length, key_length, offset=0):
    """Look-ahead mask of §3.2.3: bool `[1, T, S]`, True where query t may see key s.

    Query t sits at absolute position `offset + t` (offset > 0 when decoding
    with a cache) and sees keys 0 .. offset + t.
    """
    rows = ops.arange(query_length)[:, None] + offset
    cols = ops.arange(key_length)[None, :]
    return ops.greater_equal(rows, cols)[None, :, :]


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention with an incremental-decoding cache (§3.2.2).

    The h heads' projections are stored as the paper writes them, one matrix
    per role: W^Q, W^K in R^{D x h*d_k}, W^V in R^{D x h*d_v},
    W^O in R^{h*d_v x D}. In self-attention the three input projections run as
    one fused matmul.

    Two kinds of cache make decoding one token cost O(current length):

    - self-attention (`key_value=None`): `cache=(keys, values)`, each
      `[B, N, S_max, H]`, preallocated by `init_cache`. The keys and values of
      the query positions `[cache_index, cache_index + T)` are written into it
      and the queries attend over the whole cache (positions after the
      current one are masked by `use_causal_mask`). Outside XLA the cache may
      also hold exactly `cache_index` positions: it then grows by T
      (`init_cache(batch_size, 0)` starts an empty one).
    - cross-attention: `cache=(keys, values)` from `compute_key_value(memory)`,
      the projected encoder output, computed once per source sentence.

    Args:
        num_heads: h, the number of heads.
        key_dim: d_k, per-head width of queries and keys.
        value_dim: d_v, per-head width of values; default `key_dim`. This is
            Keras's convention for a standalone layer, which does not know
            d_model when it is constructed; with d_k = d_model / h it is the
            paper's d_v = d_model / h as well (§3.2.2). `TransformerLayer`
            (and so `Encoder`, `Decoder`, `Transformer`) always passes d_v,
            d_model / h unless set, so a smaller d_k alone (Table 3, row B)
            leaves d_v as it is.
        output_dim: width of the output; default the query's last dimension.
        dropout: dropout rate on the attention weights (not used by the paper).
        use_bias: add biases to the four projections (the paper has none).
        kernel_initializer: initializer of the projection matrices; each
            matrix gets its own copy (`initializer_for_weight`), so they start
            different. The config keeps the initializer as given.
        bias_initializer: initializer of the biases, copied per bias alike.

    Call arguments:
        query: `[B, T, D]`.
        key_value: `[B, S, D_kv]` memory to attend to, or None for
            self-attention (keys and values come from `query`).
        attention_mask: boolean, True where attention is allowed: `[B|1, T|1, S]`
            (`[B, 1, S]` masks padded keys), or `[B, S]` for key padding
            alone. Other ranks raise.
        use_causal_mask: forbid query t to attend to keys after t (§3.2.3);
            with a self-attention cache, "after" counts from `cache_index`.
        training: enables dropout.
        cache: see above; `attend` returns the updated cache.
        cache_index: int scalar, position of the first query in the cache.
            A preallocated cache must hold positions `[cache_index,
            cache_index + T)`, a growing one at most `cache_index` positions:
            a Python int that breaks this (or is negative) raises; a tensor
            one, checked only as it runs, makes the output NaN (XLA would
            clamp the write to the cache's end and cannot raise).
        projection: `input_projection()` (with `self_attention` matching
            this call) computed beforehand, e.g. once per decoding search;
            default: built in this call.

    Returns:
        `output` `[B, T, output_dim]`. `attend` takes the same arguments and
        returns an `AttentionOutput`: the output, the attention weights
        `[B, N, T, S]` and the updated cache.

    Example:
    >>> mha = MultiHeadAttention(num_heads=8, key_dim=64)
    >>> x = keras.random.normal((2, 10, 512))
    >>> tuple(mha(x, use_causal_mask=True).shape)  # [B, T, D]
    (2, 10, 512)
    >>> output, weights, _ = mha.attend(x, use_causal_mask=True)
    >>> tuple(output.shape), tuple(weights.shape)  # [B, T, D], [B, N, T, S]
    ((2, 10, 512), (2, 8, 10, 10))
    >>> float(ops.max(ops.triu(weights, k=1)))  # no query attends to a later key
    0.0

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, §3.2.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        dropout=0.0,
        use_bias=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if num_heads <= 0 or key_dim <= 0 or (value_dim is not None and value_dim <= 0):
            raise ValueError(
                f"{self.name}: num_heads, key_dim and value_dim must be positive, got "
                f"num_heads={num_heads}, key_dim={key_dim}, value_dim={value_dim}."
            )
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim or key_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        # Output positions are the query positions: a Keras mask on the query passes through.
        self.supports_masking = True

    def build(self, query_shape, key_value_shape=None):
        query_dim = query_shape[-1]
        memory_dim = query_dim if key_value_shape is None else key_value_shape[-1]
        output_dim = self.output_dim or query_dim
        n, dk, dv = self.num_heads, self.key_dim, self.value_dim

        # One initializer per weight: one shared instance would make W^Q = W^K = W^V = W^O.
        def matrix(name, shape, index):
            initializer = initializer_for_weight(self.kernel_initializer, index)
            return self.add_weight(name=name, shape=shape, initializer=initializer)

        def bias(name, size, index):
            if not self.use_bias:
                return None
            initializer = initializer_for_weight(self.bias_initializer, index)
            return self.add_weight(name=name, shape=(size,), initializer=initializer)

        self.query_kernel = matrix("query_kernel", (query_dim, n * dk), 0)
        self.key_kernel = matrix("key_kernel", (memory_dim, n * dk), 1)
        self.value_kernel = matrix("value_kernel", (memory_dim, n * dv), 2)
        self.output_kernel = matrix("output_kernel", (n * dv, output_dim), 3)
        self.query_bias = bias("query_bias", n * dk, 0)
        self.key_bias = bias("key_bias", n * dk, 1)
        self.value_bias = bias("value_bias", n * dv, 2)
        self.output_bias = bias("output_bias", output_dim, 3)
        self.dropout_layer = Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    # Projections ---------------------------------------------------------------

    def _read(self, weight):
        """`weight` in the compute dtype (None stays None).

        Inside `__call__` Keras already autocasts it, and this cast adds no
        op; `compute_key_value` outside a call and symbolic shape inference
        (`compute_output_spec`) need it.
        """
        return None if weight is None else ops.cast(weight, self.compute_dtype)

    def _project(self, x, kernel, bias, head_dim):
        """`[B, T, D] -> [B, N, T, H]`."""
        y = position_wise_matmul(x, self._read(kernel))
        if bias is not None:
            y = y + self._read(bias)
        return self._split_heads(y, head_dim)

    def _split_heads(self, y, head_dim):
        y = ops.reshape(y, leading_shape(y) + (self.num_heads, head_dim))
        return ops.transpose(y, (0, 2, 1, 3))

    def input_projection(self, self_attention=True):
        """The input projection `call` multiplies by, as `{"kernel": ..., "bias": ...}` (bias None without biases).

        Self-attention: W^Q (scaled by 1/sqrt(d_k)), W^K and W^V side by side,
        for one fused matmul; cross-attention: the scaled W^Q (keys and values
        come from `compute_key_value`). In the compute dtype. `call` builds it
        at every call unless given one (`projection=`): decoding builds it once
        per search, since a TensorFlow while loop recomputes at every step
        what its body computes, loop-invariant or not.
        """

        scale = 1.0 / math.sqrt(self.key_dim)
        # The 1/sqrt(d_k) of equation (1) scales the (small) weights rather than the queries: that spares a pass
        # over the activations, forward and backward; for d_k = 64 the scale 1/8 is a power of two, so both give
        # the same bits.
        query_kernel = self._read(self.query_kernel) * scale
        query_bias = None if self.query_bias is None else self._read(self.query_bias) * scale
        if not self_attention:
            return {"kernel": query_kernel, "bias": query_bias}
        kernel = ops.concatenate([query_kernel, self._read(self.key_kernel), self._read(self.value_kernel)], axis=-1)
        bias = None
        if self.use_bias:
            bias = ops.concatenate([query_bias, self._read(self.key_bias), self._read(self.value_bias)], axis=-1)
        return {"kernel": kernel, "bias": bias}

    def _project_qkv(self, x, projection=None):
        """Self-attention: one fused matmul for W^Q (scaled), W^K and W^V."""
        projection = projection or self.input_projection(self_attention=True)
        qkv = position_wise_matmul(x, projection["kernel"])
        if projection["bias"] is not None:
            qkv = qkv + projection["bias"]
        nk = self.num_heads * self.key_dim
        # `split` rather than slicing: its gradient is a cheap concat.
        q, k, v = ops.split(qkv, [nk, 2 * nk], axis=-1)
        return (
            self._split_heads(q, self.key_dim),
            self._split_heads(k, self.key_dim),
            self._split_heads(v, self.value_dim),
        )

    def compute_key_value(self, memory):
        """Projects an encoder output once for cross-attention decoding.

        Returns `(keys [B, N, S, d_k], values [B, N, S, d_v])`, the cache that
        `call(query, memory, cache=...)` accepts.
        """
        return (
            self._project(memory, self.key_kernel, self.key_bias, self.key_dim),
            self._project(memory, self.value_kernel, self.value_bias, self.value_dim),
        )

    def init_cache(self, batch_size, max_length, dtype=None):
        """A zero self-attention cache `(keys, values)` of `[B, N, max_length, H]`."""
        dtype = dtype or self.compute_dtype
        return (
            ops.zeros((batch_size, self.num_heads, max_length, self.key_dim), dtype=dtype),
            ops.zeros((batch_size, self.num_heads, max_length, self.value_dim), dtype=dtype),
        )

    # Attention -----------------------------------------------------------------

    def _merge_masks(self, attention_mask, use_causal_mask, q, k, offset):
        """The one place masks are combined, for queries `q [B, N, T, H]` and keys `k [B, N, S, H]`.

        Returns bool `[B|1, 1, T, S]` or None.
        """
        mask = None
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")
            if len(mask.shape) not in (2, 3):
                raise ValueError(
                    f"{self.name}: attention_mask must be [B, S] (key padding) or [B|1, T|1, S], "
                    f"got shape {tuple(mask.shape)}."
                )
            if len(mask.shape) == 2:  # [B, S]: key padding
                mask = mask[:, None, :]
            mask = mask[:, None, :, :]  # [B, 1, T|1, S]
        if use_causal_mask:  # the lengths read only here: unused shape ops would still be traced
            causal = causal_mask(ops.shape(q)[2], ops.shape(k)[2], offset)[:, None, :, :]
            mask = causal if mask is None else ops.logical_and(mask, causal)
        return mask

    def _attend(self, q, k, v, mask, training):
        """Equation (1) per head. q `[B, N, T, d_k]` (already scaled by 1/sqrt(d_k)), k `[B, N, S, d_k]`,
        v `[B, N, S, d_v]`."""
        logits = ops.einsum("bnth,bnsh->bnts", q, k)
        # Softmax in float32: bf16 logits lose the small differences that matter.
        logits = ops.cast(logits, "float32")
        if mask is not None:
            logits = ops.where(mask, logits, _MASK_LOGIT)
        if logits.shape[-1] == 1:
            # One key (a search's first step, in a plain graph): its weight is 1, what the softmax would give;
            # Keras warns about a softmax over one value.
            weights = ops.ones_like(logits, dtype=self.compute_dtype)
        else:
            weights = ops.cast(ops.softmax(logits, axis=-1), self.compute_dtype)
        context = ops.einsum("bnts,bnsh->btnh", self.dropout_layer(weights, training=training), v)
        return context, weights

    @staticmethod
    def _overflow_poison(cache, steps, index):
        """For a write of `steps` rows at a tensor `index`: 0, or NaN if the cache cannot take them.

        A scalar of the cache's dtype, NaN unless `0 <= index` and
        `index + steps <= S` (in place) or `index <= S` (a growing cache,
        which keeps its rows before `index`); None for a Python int `index`,
        which `_write_cache` checks at once. XLA's dynamic-update-slice clamps an out-of-range
        start, so a write past the end would silently overwrite the last
        rows; XLA also drops `tf.debugging` asserts and `check_numerics`
        (TF 2.21 under `jit_compile=True` runs them without error). Adding
        this scalar to the written rows and to the layer's output makes a
        broken contract visible as NaN instead.
        """
        if isinstance(index, int):
            return None
        rows = ops.shape(cache)[2]
        # In place the T rows must fit; a growing cache takes rows [0, index) as they are, so index <= S.
        end = index + steps if in_place_cache_writes() else index
        outside = ops.logical_or(index < 0, end > rows)
        return ops.cast(ops.where(outside, float("nan"), 0.0), cache.dtype)

    @staticmethod
    def _write_cache(cache, update, index):
        """Writes `update [B, N, T, H]` at positions [index, index + T) of `cache [B, N, S, H]`.

        Where a dynamic-update-slice is available (XLA, other backends), it
        writes the T new rows in place. The cache must then have room for
        them, `0 <= index` and `index + T <= S`: a Python int `index` that
        breaks this raises a ValueError; a tensor one (only known when the
        compiled function runs) makes the written rows NaN, and the layer's
        output too (see `_overflow_poison`). Otherwise (a plain TensorFlow
        graph, as in a SavedModel or TF Serving) the rows before `index`,
        the update and the rows after it are concatenated: a cache of
        exactly `index` rows grows by T, which lets graph-mode decoding start
        from an empty cache and only ever copy and attend over the rows in use.
        """
        update = ops.cast(update, cache.dtype)
        rows, steps = cache.shape[2], update.shape[2]
        if isinstance(index, int) and index < 0:
            raise ValueError(f"cache_index must be >= 0, got {index}.")
        if in_place_cache_writes():
            if isinstance(index, int) and rows is not None and steps is not None and index + steps > rows:
                raise ValueError(
                    f"A self-attention cache of {rows} positions has no room for positions "
                    f"{index}..{index + steps - 1}: preallocate it with `init_cache`."
                )
            poison = MultiHeadAttention._overflow_poison(cache, ops.shape(update)[2], index)
            if poison is not None:
                update = update + poison
            return ops.slice_update(cache, (0, 0, index, 0), update)
        if isinstance(index, int) and rows is not None and index > rows:
            raise ValueError(
                f"A self-attention cache of {rows} positions cannot take positions from {index}: "
                f"a growing cache holds exactly the positions before cache_index."
            )
        steps = ops.shape(update)[2]
        return ops.concatenate([cache[:, :, :index], update, cache[:, :, index + steps :]], axis=2)

    def call(
        self,
        query,
        key_value=None,
        attention_mask=None,
        use_causal_mask=False,
        training=None,
        cache=None,
        cache_index=None,
        projection=None,
        _full_result=False,
    ):
        for name, tensor in (("query", query), ("key_value", key_value)):
            if tensor is not None and len(tensor.shape) != 3:
                raise ValueError(f"{self.name}: {name} must be [B, T, D], got shape {tuple(tensor.shape)}.")
        offset, poison = 0, None
        if key_value is None:
            q, k, v = self._project_qkv(query, projection)
            if cache is not None:
                if cache_index is None:
                    raise ValueError(f"{self.name}: a self-attention cache needs `cache_index`.")
                poison = self._overflow_poison(cache[0], ops.shape(q)[2], cache_index)
                k = self._write_cache(cache[0], k, cache_index)
                v = self._write_cache(cache[1], v, cache_index)
                cache = (k, v)
                offset = cache_index
        else:
            projection = projection or self.input_projection(self_attention=False)
            q = self._project(query, projection["kernel"], projection["bias"], self.key_dim)
            if cache is not None:
                k, v = cache
            else:
                k, v = self.compute_key_value(key_value)

        mask = self._merge_masks(attention_mask, use_causal_mask, q, k, offset)
        context, weights = self._attend(q, k, v, mask, training)  # [B, T, N, d_v]
        output = position_wise_matmul(context, self._read(self.output_kernel), merged_axes=2)  # Concat(heads) W^O
        if self.output_bias is not None:
            output = output + self._read(self.output_bias)
        if poison is not None:  # NaN if the cache had no room for these positions
            output = output + ops.cast(poison, output.dtype)
        if not _full_result:
            return output
        return (output, weights) if cache is None else (output, weights, cache)  # Keras outputs are tensors, not None

    def attend(
        self,
        query,
        key_value=None,
        attention_mask=None,
        use_causal_mask=False,
        cache=None,
        cache_index=None,
        training=None,
        projection=None,
    ):
        """The attention's output with its weights and updated cache, as an `AttentionOutput`.

        Runs the layer (`__call__`, so building, autocasting and the training
        flag work as for `call`) and returns everything it computed. Arguments
        as in `call`; with `cache` and `cache_index` for incremental decoding
        (see the class docstring).

        Returns:
            `AttentionOutput(output, weights, cache)`.

        Example:
        >>> mha = MultiHeadAttention(num_heads=2, key_dim=4)
        >>> x = keras.random.normal((1, 3, 8))
        >>> result = mha.attend(x[:, :1], use_causal_mask=True, cache=mha.init_cache(1, 3), cache_index=0)
        >>> tuple(result.output.shape), tuple(result.weights.shape), tuple(result.cache[0].shape)
        ((1, 1, 8), (1, 2, 1, 3), (1, 2, 3, 4))
        """
        output, weights, *new_cache = self(
            query,
            key_value,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            training=training,
            cache=cache,
            cache_index=cache_index,
            projection=projection,
            _full_result=True,
        )
        return AttentionOutput(output, weights, new_cache[0] if new_cache else None)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "output_dim": self.output_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
