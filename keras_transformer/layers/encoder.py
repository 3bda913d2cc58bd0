"""The encoder: a stack of N identical layers (Vaswani et al., 2017, §3.1).

"Each layer has two sub-layers. The first is a multi-head self-attention
mechanism, and the second is a simple, position-wise fully connected
feed-forward network. We employ a residual connection around each of the two
sub-layers, followed by layer normalization."
"""

from typing import Any, NamedTuple

import keras
from keras import ops

from keras_transformer.layers.base import TransformerLayer, TransformerStack


class EncoderOutput(NamedTuple):
    """What `EncoderLayer.encode` and `Encoder.encode` return.

    Attributes:
        output: `[B, S, d_model]`, what `call` returns.
        attention_weights: the self-attention weights `[B, h, S, S]`; from
            `Encoder`, a list with one per layer.
    """

    output: Any
    attention_weights: Any


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderLayer(TransformerLayer):
    """One encoder layer: self-attention, then feed-forward, each in a residual connection (§3.1).

    Subclass it and override `make_feed_forward` (or pass `activation`) to
    change the feed-forward sublayer; the subclass serializes like this class.

    Args:
        num_heads: h.
        d_ff: inner width of the feed-forward network.
        key_dim: d_k; default d_model // num_heads (§3.2.2).
        value_dim: d_v; default d_model // num_heads (§3.2.2), also when
            key_dim is given.
        dropout: residual dropout P_drop (§5.4).
        attention_dropout: dropout on attention weights (0 in the paper).
        activation: feed-forward activation ("relu", §3.3).
        norm_first: pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: LayerNorm epsilon.
        use_bias: biases in the attention projections.

    Call arguments:
        inputs: `[B, S, d_model]`.
        attention_mask: bool, broadcastable to `[B, S, S]`; `[B, 1, S]` masks
            padded keys.
        mask: a Keras mask `[B, S]` on `inputs`, used as the key padding mask
            when `attention_mask` is not given (so layers stacked in a
            functional model after `Embedding(mask_zero=True)` mask padding).
        training: enables dropout.

    Returns:
        `outputs [B, S, d_model]`. `encode` takes the same arguments and
        returns an `EncoderOutput`: the outputs and the attention weights.

    Example:
    >>> layer = EncoderLayer(num_heads=4, d_ff=128)
    >>> outputs, weights = layer.encode(keras.random.normal((2, 9, 32)))
    >>> tuple(outputs.shape), tuple(weights.shape)  # [B, S, d_model], [B, h, S, S]
    ((2, 9, 32), (2, 4, 9, 9))
    """

    def build(self, input_shape):
        self.self_attention = self.make_attention("self_attention", input_shape[-1])
        self.self_attention.build(input_shape)
        self.self_attention_connection = self.make_connection("self_attention_connection")
        self.self_attention_connection.build(input_shape)
        self.feed_forward = self.make_feed_forward()
        self.feed_forward.build(input_shape)
        self.feed_forward_connection = self.make_connection("feed_forward_connection")
        self.feed_forward_connection.build(input_shape)
        self.built = True

    def call(self, inputs, attention_mask=None, mask=None, training=None, _full_result=False):
        if attention_mask is None and mask is not None:
            # A Keras mask on the inputs (e.g. Embedding(mask_zero=True)) marks padded keys.
            attention_mask = ops.cast(mask, "bool")[:, None, :]
        x = inputs
        attention = self.self_attention.attend(
            self.self_attention_connection.normalize(x), attention_mask=attention_mask, training=training
        )
        x = self.self_attention_connection(x, attention.output, training=training)
        y = self.feed_forward(self.feed_forward_connection.normalize(x))
        x = self.feed_forward_connection(x, y, training=training)
        return (x, attention.weights) if _full_result else x

    def encode(self, inputs, attention_mask=None, training=None):
        """The layer's outputs with its attention weights, as an `EncoderOutput` (arguments as `call`)."""
        return EncoderOutput(*self(inputs, attention_mask=attention_mask, training=training, _full_result=True))


@keras.saving.register_keras_serializable(package="keras_transformer")
class Encoder(TransformerStack):
    """A stack of `num_layers` EncoderLayers (§3.1), with a final LayerNorm for pre-LN.

    It reads embeddings (add positions yourself, e.g. with
    `PositionalEncoding`) and a padding mask, which it turns into the
    attention mask once for all layers.

    Args:
        num_layers: N.
        num_heads, d_ff, key_dim, value_dim, dropout, attention_dropout,
        activation, norm_first, layer_norm_epsilon, use_bias: as in
            `EncoderLayer`.

    Call arguments:
        inputs: `[B, S, d_model]` embeddings.
        padding_mask: bool `[B, S]`, True at real tokens. If omitted, a Keras
            mask on `inputs` (e.g. from `Embedding(mask_zero=True)`) is used.
        training: enables dropout.

    Returns:
        `[B, S, d_model]`. `encode` takes the same arguments and returns an
        `EncoderOutput`: the outputs and the list of each layer's attention
        weights.

    Example:
    >>> encoder = Encoder(num_layers=2, num_heads=4, d_ff=128)
    >>> x = keras.random.normal((2, 9, 32))
    >>> padding_mask = ops.arange(9) < ops.array([[9], [6]])  # the 2nd sentence has 6 tokens
    >>> outputs, weights = encoder.encode(x, padding_mask=padding_mask)
    >>> tuple(outputs.shape), len(weights)
    ((2, 9, 32), 2)
    >>> float(ops.max(weights[1][1, :, :, 6:]))  # no attention to the padding
    0.0
    """

    layer_class = EncoderLayer

    def __init__(self, num_layers, num_heads, d_ff, **kwargs):
        super().__init__(num_layers, num_heads, d_ff, **kwargs)
        self.supports_masking = True

    def build(self, input_shape):
        self.encoder_layers = self.build_layers(input_shape)
        self.built = True

    def call(self, inputs, padding_mask=None, mask=None, training=None, _full_result=False):
        if padding_mask is None:
            padding_mask = mask
        attention_mask = None if padding_mask is None else ops.cast(padding_mask, "bool")[:, None, :]
        x, all_weights = inputs, []
        for layer in self.encoder_layers:
            x, weights = layer.encode(x, attention_mask=attention_mask, training=training)
            all_weights.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return (x, all_weights) if _full_result else x

    def encode(self, inputs, padding_mask=None, training=None):
        """The stack's outputs with each layer's attention weights, as an `EncoderOutput` (arguments as `call`)."""
        return EncoderOutput(*self(inputs, padding_mask=padding_mask, training=training, _full_result=True))

    def compute_mask(self, inputs, mask=None):
        return mask
