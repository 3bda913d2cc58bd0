"""Keras 3 layers of the Transformer, one concept per module, in the paper's order.

- `attention`: MultiHeadAttention (§3.2)
- `feed_forward`: FeedForward (§3.3)
- `embedding`: SharedEmbedding (§3.4)
- `positional_encoding`: PositionalEncoding, LearnedPositionalEmbedding (§3.5)
- `dropout`: Dropout with an exact rate in every dtype (§5.4)
- `layer_norm`: LayerNormalization with a closed-form gradient (§3.1)
- `sublayer`: SublayerConnection, the residual + LayerNorm of §3.1 / §5.4
- `initialization`: initializer_for_weight, one initializer copy per weight
- `base`: TransformerLayer, TransformerStack, what encoder and decoder share
- `encoder`: EncoderLayer, Encoder (§3.1)
- `decoder`: DecoderLayer, Decoder (§3.1)
"""

from keras_transformer.layers.attention import MultiHeadAttention, causal_mask
from keras_transformer.layers.base import TransformerLayer, TransformerStack
from keras_transformer.layers.decoder import Decoder, DecoderLayer
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder import Encoder, EncoderLayer
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.positional_encoding import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_encoding,
)
from keras_transformer.layers.sublayer import SublayerConnection

__all__ = [
    "Decoder",
    "DecoderLayer",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "LayerNormalization",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "SharedEmbedding",
    "SublayerConnection",
    "TransformerLayer",
    "TransformerStack",
    "causal_mask",
    "sinusoidal_encoding",
]
