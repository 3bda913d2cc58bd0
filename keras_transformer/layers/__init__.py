"""Keras 3 layers of the Transformer, one concept per module, in the paper's order.

- `attention`: MultiHeadAttention and its AttentionOutput (§3.2)
- `feed_forward`: FeedForward (§3.3)
- `embedding`: SharedEmbedding (§3.4)
- `positional_encoding`: PositionalEncoding, LearnedPositionalEmbedding (§3.5)
- `dropout`: Dropout with an exact rate in every dtype (§5.4)
- `layer_norm`: LayerNormalization (§3.1)
- `sublayer`: SublayerConnection, the residual + LayerNorm of §3.1 / §5.4
- `initialization`: initializer_for_weight, one initializer copy per weight
- `base`: LayerHyperparameters, TransformerLayer, TransformerStack, what encoder and decoder share
- `encoder`: EncoderLayer, Encoder and their EncoderOutput (§3.1)
- `decoder`: DecoderLayer, Decoder and their DecoderOutput (§3.1)

Each layer's `call` returns one tensor; `attend`, `encode` and `decode`
return the named results with attention weights and caches. The CPU and
compiler forms some layers call are in `keras_transformer.kernels`.
"""

from keras_transformer.layers.attention import AttentionOutput, MultiHeadAttention, causal_mask
from keras_transformer.layers.base import LayerHyperparameters, TransformerLayer, TransformerStack
from keras_transformer.layers.decoder import Decoder, DecoderLayer, DecoderOutput
from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.embedding import SharedEmbedding
from keras_transformer.layers.encoder import Encoder, EncoderLayer, EncoderOutput
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.positional_encoding import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    sinusoidal_encoding,
)
from keras_transformer.layers.sublayer import SublayerConnection

__all__ = [
    "AttentionOutput",
    "Decoder",
    "DecoderLayer",
    "DecoderOutput",
    "Dropout",
    "Encoder",
    "EncoderLayer",
    "EncoderOutput",
    "FeedForward",
    "LayerHyperparameters",
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
