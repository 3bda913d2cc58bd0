"""The decoder: a stack of N identical layers (Vaswani et al., 2017, §3.1).

"In addition to the two sub-layers in each encoder layer, the decoder inserts
a third sub-layer, which performs multi-head attention over the output of the
encoder stack. [...] We also modify the self-attention sub-layer in the
decoder stack to prevent positions from attending to subsequent positions."
"""

import keras
from keras import ops

from keras_transformer.layers.attention import causal_mask
from keras_transformer.layers.base import TransformerLayer, TransformerStack


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderLayer(TransformerLayer):
    """One decoder layer: masked self-attention, encoder-decoder attention, feed-forward (§3.1).

    Args: as `EncoderLayer`.

    Call arguments:
        inputs: `[B, T, d_model]`.
        memory: the encoder output `[B, S, d_model]`.
        self_attention_mask: bool, broadcastable to `[B, T, T]` (or
            `[B, T, S_max]` with a cache). Causality is part of this mask:
            `Decoder` builds it once for all layers. If None,
            `use_causal_mask` decides.
        memory_mask: bool, broadcastable to `[B, T, S]`; `[B, 1, S]` masks
            padded source tokens.
        use_causal_mask: build the look-ahead mask here (when no
            `self_attention_mask` is given).
        self_attention_cache: `(keys, values)` `[B, h, S_max, d]` or None.
        cross_attention_cache: `(keys, values)` of `memory`, or None.
        cache_index: position of the first input step in the cache.
        training: enables dropout.
        return_attention_scores: also return the self- and cross-attention weights.
        projections: `input_projections()` computed beforehand (e.g. once
            per decoding search), or None to build them in this call.

    Returns:
        `outputs [B, T, d_model]`; then, with `return_attention_scores`,
        `self_weights, cross_weights`; then, with a self-attention cache, the
        updated cache.

    Example:
    >>> layer = DecoderLayer(num_heads=4, d_ff=128)
    >>> y, memory = keras.random.normal((2, 5, 32)), keras.random.normal((2, 9, 32))
    >>> tuple(layer(y, memory, use_causal_mask=True).shape)  # [B, T, d_model]
    (2, 5, 32)
    """

    def build(self, inputs_shape, memory_shape=None):
        d_model = inputs_shape[-1]
        self.self_attention = self.make_attention("self_attention", d_model)
        self.self_attention.build(inputs_shape)
        self.self_attention_connection = self.make_connection("self_attention_connection")
        self.self_attention_connection.build(inputs_shape)
        self.cross_attention = self.make_attention("cross_attention", d_model)
        self.cross_attention.build(inputs_shape, memory_shape or inputs_shape)
        self.cross_attention_connection = self.make_connection("cross_attention_connection")
        self.cross_attention_connection.build(inputs_shape)
        self.feed_forward = self.make_feed_forward()
        self.feed_forward.build(inputs_shape)
        self.feed_forward_connection = self.make_connection("feed_forward_connection")
        self.feed_forward_connection.build(inputs_shape)
        self.built = True

    def input_projections(self):
        """Both attentions' input projections (`MultiHeadAttention.input_projection`): `{"self": ..., "cross": ...}`."""
        return {
            "self": self.self_attention.input_projection(self_attention=True),
            "cross": self.cross_attention.input_projection(self_attention=False),
        }

    def call(
        self,
        inputs,
        memory,
        self_attention_mask=None,
        memory_mask=None,
        use_causal_mask=False,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_index=None,
        training=None,
        return_attention_scores=False,
        projections=None,
    ):
        projections = projections or {}
        x = inputs
        # 1. Masked multi-head self-attention.
        y = self.self_attention(
            self.self_attention_connection.normalize(x),
            attention_mask=self_attention_mask,
            use_causal_mask=use_causal_mask and self_attention_mask is None,
            cache=self_attention_cache,
            cache_index=cache_index,
            return_attention_scores=return_attention_scores,
            training=training,
            projection=projections.get("self"),
        )
        y, self_weights, self_attention_cache = self._unpack(y, return_attention_scores, self_attention_cache)
        x = self.self_attention_connection(x, y, training=training)

        # 2. Encoder-decoder attention: queries from the decoder, keys and values from the encoder.
        y = self.cross_attention(
            self.cross_attention_connection.normalize(x),
            memory,
            attention_mask=memory_mask,
            cache=cross_attention_cache,
            return_attention_scores=return_attention_scores,
            training=training,
            projection=projections.get("cross"),
        )
        y, cross_weights, _ = self._unpack(y, return_attention_scores, cross_attention_cache)
        x = self.cross_attention_connection(x, y, training=training)

        # 3. Position-wise feed-forward.
        y = self.feed_forward(self.feed_forward_connection.normalize(x))
        x = self.feed_forward_connection(x, y, training=training)

        results = (x,)
        if return_attention_scores:
            results += (self_weights, cross_weights)
        if self_attention_cache is not None:
            results += (self_attention_cache,)
        return results[0] if len(results) == 1 else results

    @staticmethod
    def _unpack(result, with_weights, cache):
        if not with_weights and cache is None:
            return result, None, None
        result = list(result)
        output = result.pop(0)
        weights = result.pop(0) if with_weights else None
        new_cache = result.pop(0) if cache is not None else None
        return output, weights, new_cache


@keras.saving.register_keras_serializable(package="keras_transformer")
class Decoder(TransformerStack):
    """A stack of `num_layers` DecoderLayers (§3.1), with a final LayerNorm for pre-LN.

    Masks are built here once per call and shared by all layers: the
    look-ahead mask (§3.2.3) combined with target padding, and the source
    padding mask for encoder-decoder attention.

    For incremental decoding, `init_cache(memory, max_length)` returns
    `{"self": [...], "cross": [...]}`, one `(keys, values)` pair per layer:
    preallocated self-attention slots (outside XLA, `max_length=0` gives
    empty ones that grow by T per call) and the encoder output projected once.
    `call(..., cache=cache, cache_index=i)` then decodes steps
    `i .. i + T - 1` and returns `(outputs, new_cache)`. A cache may also
    carry `cache["shared"]["decoder_projections"]`, the layers' input
    projections from `input_projections()`, computed once per search instead
    of at every step (`Transformer.init_cache` adds them).

    Args: `num_layers` (N) and those of `DecoderLayer`.

    Call arguments:
        inputs: `[B, T, d_model]` target embeddings (with positions).
        memory: encoder output `[B, S, d_model]`.
        memory_padding_mask: bool `[B, S]`, True at real source tokens.
        padding_mask: bool `[B, T]`, True at real target tokens (optional:
            causality alone keeps real positions away from trailing padding).
        cache, cache_index: see above.
        self_attention_mask: bool, broadcastable to `[B, T, S_max]`: with a
            cache, which cache slots each input step may attend to, instead
            of the look-ahead mask from `cache_index`. Beam search passes
            each hypothesis's ancestry (see `keras_transformer.decoding`).
        training: enables dropout.
        return_attention_scores: also return
            `{"self": [per layer], "cross": [per layer]}` weights.

    Example:
    >>> decoder = Decoder(num_layers=2, num_heads=4, d_ff=128)
    >>> y, memory = keras.random.normal((2, 5, 32)), keras.random.normal((2, 9, 32))
    >>> outputs, weights = decoder(y, memory, return_attention_scores=True)
    >>> tuple(outputs.shape), len(weights["self"]), tuple(weights["cross"][0].shape)
    ((2, 5, 32), 2, (2, 4, 5, 9))
    """

    layer_class = DecoderLayer

    def build(self, inputs_shape, memory_shape=None):
        self.decoder_layers = self.build_layers(inputs_shape, memory_shape)
        self.built = True

    def init_cache(self, memory, max_length):
        """Decoding cache for `memory [B, S, d_model]` and up to `max_length` target steps."""
        batch_size = ops.shape(memory)[0]
        return {
            "self": [layer.self_attention.init_cache(batch_size, max_length) for layer in self.decoder_layers],
            "cross": [layer.cross_attention.compute_key_value(memory) for layer in self.decoder_layers],
        }

    def input_projections(self):
        """Each layer's input projections (`DecoderLayer.input_projections`), a list."""
        return [layer.input_projections() for layer in self.decoder_layers]

    def call(
        self,
        inputs,
        memory,
        memory_padding_mask=None,
        padding_mask=None,
        cache=None,
        cache_index=None,
        self_attention_mask=None,
        training=None,
        return_attention_scores=False,
    ):
        if cache is not None and cache_index is None:
            raise ValueError(f"{self.name}: decoding with a cache needs `cache_index`.")
        length = ops.shape(inputs)[1]
        if self_attention_mask is not None:
            if cache is None:
                raise ValueError(f"{self.name}: `self_attention_mask` is for decoding with a cache.")
            self_mask = ops.cast(self_attention_mask, "bool")
        elif cache is None:
            self_mask = causal_mask(length, length)
            if padding_mask is not None:
                self_mask = ops.logical_and(self_mask, ops.cast(padding_mask, "bool")[:, None, :])
        else:
            # Keys after the write: the preallocated slots, or a growing
            # cache's `cache_index + T` (see MultiHeadAttention).
            key_length = ops.maximum(ops.shape(cache["self"][0][0])[2], cache_index + length)
            self_mask = causal_mask(length, key_length, offset=cache_index)
        memory_mask = None
        if memory_padding_mask is not None:
            memory_mask = ops.cast(memory_padding_mask, "bool")[:, None, :]

        x = inputs
        projections = None if cache is None else cache.get("shared", {}).get("decoder_projections")
        new_self_cache, self_weights, cross_weights = [], [], []
        for i, layer in enumerate(self.decoder_layers):
            out = layer(
                x,
                memory,
                self_attention_mask=self_mask,
                memory_mask=memory_mask,
                self_attention_cache=None if cache is None else cache["self"][i],
                cross_attention_cache=None if cache is None else cache["cross"][i],
                cache_index=cache_index,
                training=training,
                return_attention_scores=return_attention_scores,
                projections=None if projections is None else projections[i],
            )
            if not isinstance(out, (tuple, list)):
                x = out
                continue
            out = list(out)
            x = out.pop(0)
            if return_attention_scores:
                self_weights.append(out.pop(0))
                cross_weights.append(out.pop(0))
            if cache is not None:
                new_self_cache.append(out.pop(0))
        if self.final_norm is not None:
            x = self.final_norm(x)

        results = (x,)
        if return_attention_scores:
            results += ({"self": self_weights, "cross": cross_weights},)
        if cache is not None:
            # Only the self-attention entries change; the rest ("cross", and
            # anything a caller keeps beside them) passes through.
            results += ({**cache, "self": new_self_cache},)
        return results[0] if len(results) == 1 else results
