"""The decoder: a stack of N identical layers (Vaswani et al., 2017, §3.1).

"In addition to the two sub-layers in each encoder layer, the decoder inserts
a third sub-layer, which performs multi-head attention over the output of the
encoder stack. [...] We also modify the self-attention sub-layer in the
decoder stack to prevent positions from attending to subsequent positions."
"""

from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.layers.attention import causal_mask
from keras_transformer.layers.base import TransformerLayer, TransformerStack


class DecoderOutput(NamedTuple):
    """What `DecoderLayer.decode` and `Decoder.decode` return.

    Attributes:
        output: `[B, T, d_model]`, what `call` returns.
        self_attention_weights: the masked self-attention weights
            `[B, h, T, S_self]`; from `Decoder`, a list with one per layer.
        cross_attention_weights: the encoder-decoder attention weights
            `[B, h, T, S]`; from `Decoder`, a list with one per layer.
        cache: the updated decoding cache (`DecoderLayer`: the
            self-attention `(keys, values)`; `Decoder`: the cache dict), or
            None without a cache.
    """

    output: Any
    self_attention_weights: Any
    cross_attention_weights: Any
    cache: Any


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
        projections: `input_projections()` computed beforehand (e.g. once
            per decoding search), or None to build them in this call.

    Returns:
        `outputs [B, T, d_model]`. `decode` takes the same arguments and
        returns a `DecoderOutput`: the outputs, both attentions' weights and
        the updated self-attention cache.

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
        training=None,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_index=None,
        projections=None,
        _full_result=False,
    ):
        projections = projections or {}
        x = inputs
        # 1. Masked multi-head self-attention.
        self_attention = self.self_attention.attend(
            self.self_attention_connection.normalize(x),
            attention_mask=self_attention_mask,
            use_causal_mask=use_causal_mask and self_attention_mask is None,
            cache=self_attention_cache,
            cache_index=cache_index,
            training=training,
            projection=projections.get("self"),
        )
        x = self.self_attention_connection(x, self_attention.output, training=training)

        # 2. Encoder-decoder attention: queries from the decoder, keys and values from the encoder.
        cross_attention = self.cross_attention.attend(
            self.cross_attention_connection.normalize(x),
            memory,
            attention_mask=memory_mask,
            cache=cross_attention_cache,
            training=training,
            projection=projections.get("cross"),
        )
        x = self.cross_attention_connection(x, cross_attention.output, training=training)

        # 3. Position-wise feed-forward.
        y = self.feed_forward(self.feed_forward_connection.normalize(x))
        x = self.feed_forward_connection(x, y, training=training)
        if not _full_result:
            return x
        result = (x, self_attention.weights, cross_attention.weights)
        return result if self_attention.cache is None else (*result, self_attention.cache)  # no None in outputs

    def compute_output_spec(self, inputs, memory=None, *args, _full_result=False, **kwargs):
        """The outputs' spec: `inputs`' shape in the compute dtype (`decode`'s results: traced)."""
        if _full_result:
            return super().compute_output_spec(inputs, memory, *args, _full_result=True, **kwargs)
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def decode(
        self,
        inputs,
        memory,
        self_attention_mask=None,
        memory_mask=None,
        use_causal_mask=False,
        training=None,
        self_attention_cache=None,
        cross_attention_cache=None,
        cache_index=None,
        projections=None,
    ):
        """The layer's outputs with both attentions' weights and the updated cache, as a `DecoderOutput`.

        Runs the layer (`__call__`) with the arguments of `call`; the cache
        is None without `self_attention_cache`.
        """
        output, self_weights, cross_weights, *new_cache = self(
            inputs,
            memory,
            self_attention_mask=self_attention_mask,
            memory_mask=memory_mask,
            use_causal_mask=use_causal_mask,
            training=training,
            self_attention_cache=self_attention_cache,
            cross_attention_cache=cross_attention_cache,
            cache_index=cache_index,
            projections=projections,
            _full_result=True,
        )
        return DecoderOutput(output, self_weights, cross_weights, new_cache[0] if new_cache else None)


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
    `decode(..., cache=cache, cache_index=i)` then decodes steps
    `i .. i + T - 1` and returns their outputs with the new cache in a
    `DecoderOutput`. A cache may also
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

    Returns:
        `outputs [B, T, d_model]`. `decode` takes the same arguments and
        returns a `DecoderOutput`: the outputs, each layer's attention
        weights, and the updated cache.

    Example:
    >>> decoder = Decoder(num_layers=2, num_heads=4, d_ff=128)
    >>> y, memory = keras.random.normal((2, 5, 32)), keras.random.normal((2, 9, 32))
    >>> tuple(decoder(y, memory).shape)
    (2, 5, 32)
    >>> result = decoder.decode(y, memory)
    >>> len(result.self_attention_weights), tuple(result.cross_attention_weights[0].shape)
    (2, (2, 4, 5, 9))
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
        _full_result=False,
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
            result = layer.decode(
                x,
                memory,
                self_attention_mask=self_mask,
                memory_mask=memory_mask,
                self_attention_cache=None if cache is None else cache["self"][i],
                cross_attention_cache=None if cache is None else cache["cross"][i],
                cache_index=cache_index,
                training=training,
                projections=None if projections is None else projections[i],
            )
            x = result.output
            self_weights.append(result.self_attention_weights)
            cross_weights.append(result.cross_attention_weights)
            new_self_cache.append(result.cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        if not _full_result:
            return x
        # Only the self-attention entries change; the rest ("cross", and
        # anything a caller keeps beside them) passes through.
        new_cache = None if cache is None else {**cache, "self": new_self_cache}
        return (x, self_weights, cross_weights) if cache is None else (x, self_weights, cross_weights, new_cache)

    def compute_output_spec(self, inputs, memory=None, *args, _full_result=False, **kwargs):
        """The outputs' spec: `inputs`' shape in the compute dtype (`decode`'s results: traced)."""
        if _full_result:
            return super().compute_output_spec(inputs, memory, *args, _full_result=True, **kwargs)
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype)

    def decode(
        self,
        inputs,
        memory,
        memory_padding_mask=None,
        padding_mask=None,
        cache=None,
        cache_index=None,
        self_attention_mask=None,
        training=None,
    ):
        """The stack's outputs with every layer's attention weights and the updated cache, as a `DecoderOutput`.

        Runs the stack (`__call__`) with the arguments of `call`; the cache
        is None without `cache`.
        """
        output, self_weights, cross_weights, *new_cache = self(
            inputs,
            memory,
            memory_padding_mask=memory_padding_mask,
            padding_mask=padding_mask,
            cache=cache,
            cache_index=cache_index,
            self_attention_mask=self_attention_mask,
            training=training,
            _full_result=True,
        )
        return DecoderOutput(output, self_weights, cross_weights, new_cache[0] if new_cache else None)
