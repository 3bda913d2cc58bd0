"""What an encoder layer and a decoder layer have in common (Vaswani et al., 2017, §3.1).

Both are built from the same parts: multi-head attention (§3.2), the
position-wise feed-forward network (§3.3) and the residual connection with
dropout and layer normalization around each (§3.1, §5.4). `TransformerLayer`
holds their shared hyperparameters (`LayerHyperparameters`, the one list of
them) and makes those parts; `TransformerStack` holds a stack of N such
layers.
"""

import dataclasses
from typing import Any

import keras

from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import FeedForward
from keras_transformer.layers.layer_norm import LayerNormalization
from keras_transformer.layers.sublayer import SublayerConnection


def resolve_head_dims(d_model, num_heads, key_dim, value_dim, where):
    """`(d_k, d_v)`, each d_model / h unless given (§3.2.2), with a clear error when h does not divide.

    d_v does not follow a given d_k: Table 3 row (B) shrinks d_k alone.
    """
    dims = {"key_dim": key_dim, "value_dim": value_dim}
    for name, value in dims.items():
        if value is not None:
            continue
        if d_model % num_heads:
            raise ValueError(f"{where}: d_model={d_model} is not divisible by num_heads={num_heads}; pass {name}.")
        dims[name] = d_model // num_heads
    return dims["key_dim"], dims["value_dim"]


@dataclasses.dataclass
class LayerHyperparameters:
    """The hyperparameters every encoder and decoder layer takes, with their defaults (§3.1-§3.3, §5.4).

    The one list of them: `TransformerLayer` and `TransformerStack` take
    them as keyword arguments and serialize them, `Transformer` reads them
    from its `TransformerConfig`.

    Attributes:
        num_heads: h (§3.2.2).
        d_ff: inner width of the feed-forward network (§3.3).
        key_dim: d_k; default d_model // num_heads (§3.2.2).
        value_dim: d_v; default d_model // num_heads (§3.2.2), also when
            key_dim is given.
        dropout: residual dropout P_drop (§5.4).
        attention_dropout: dropout on attention weights (0 in the paper).
        activation: feed-forward activation ("relu", §3.3).
        norm_first: pre-LN instead of the paper's post-LN.
        layer_norm_epsilon: LayerNorm epsilon.
        use_bias: biases in the attention projections.
    """

    num_heads: int
    d_ff: int
    key_dim: int | None = None
    value_dim: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation: Any = "relu"
    norm_first: bool = False
    layer_norm_epsilon: float = 1e-6
    use_bias: bool = False

    @classmethod
    def take(cls, num_heads, d_ff, kwargs):
        """The hyperparameters among `kwargs` (removed from it), with `num_heads` and `d_ff`."""
        names = [field.name for field in dataclasses.fields(cls)]
        return cls(num_heads, d_ff, **{name: kwargs.pop(name) for name in names if name in kwargs})

    @classmethod
    def of(cls, source):
        """The hyperparameters read from the attributes of `source` (e.g. a `TransformerConfig`)."""
        return cls(**{field.name: getattr(source, field.name) for field in dataclasses.fields(cls)})

    def to_config(self):
        """A JSON-friendly dict, the activation serialized."""
        config = dataclasses.asdict(self)
        config["activation"] = keras.activations.serialize(keras.activations.get(self.activation))
        return config


class TransformerLayer(keras.layers.Layer):
    """Base of `EncoderLayer` and `DecoderLayer`: shared hyperparameters and sublayer factories.

    Args:
        num_heads: h.
        d_ff: inner width of the feed-forward network.
        **kwargs: the other `LayerHyperparameters` (key_dim, value_dim,
            dropout, attention_dropout, activation, norm_first,
            layer_norm_epsilon, use_bias), then the usual layer arguments.
    """

    def __init__(self, num_heads, d_ff, **kwargs):
        hyperparameters = LayerHyperparameters.take(num_heads, d_ff, kwargs)
        super().__init__(**kwargs)
        self.hyperparameters = hyperparameters
        for name, value in dataclasses.asdict(self.hyperparameters).items():
            setattr(self, name, value)
        self.activation = keras.activations.get(self.activation)
        self.supports_masking = True

    def make_feed_forward(self):
        """The feed-forward sublayer; override to change it."""
        return FeedForward(self.d_ff, activation=self.activation, dtype=self.dtype_policy, name="feed_forward")

    def make_attention(self, name, d_model):
        """A multi-head attention sublayer for inputs of width `d_model`."""
        key_dim, value_dim = resolve_head_dims(d_model, self.num_heads, self.key_dim, self.value_dim, self.name)
        return MultiHeadAttention(
            self.num_heads,
            key_dim,
            value_dim,
            dropout=self.attention_dropout,
            use_bias=self.use_bias,
            dtype=self.dtype_policy,
            name=name,
        )

    def make_connection(self, name):
        """The residual connection (dropout, add, LayerNorm) around one sublayer."""
        return SublayerConnection(
            self.dropout, self.norm_first, self.layer_norm_epsilon, dtype=self.dtype_policy, name=name
        )

    def get_config(self):
        config = super().get_config()
        config.update(self.hyperparameters.to_config())
        return config


class TransformerStack(keras.layers.Layer):
    """Base of `Encoder` and `Decoder`: N layers of `layer_class`, a final LayerNorm for pre-LN.

    Args:
        num_layers: N.
        num_heads: h.
        d_ff: inner width of the feed-forward network.
        **kwargs: the other `LayerHyperparameters`, passed to every layer (so
            d_k and d_v default to d_model // num_heads there, §3.2.2), then
            the usual layer arguments.
    """

    layer_class = None  # set by subclasses

    def __init__(self, num_layers, num_heads, d_ff, **kwargs):
        hyperparameters = LayerHyperparameters.take(num_heads, d_ff, kwargs)
        super().__init__(**kwargs)
        if num_layers <= 0:
            raise ValueError(f"{self.name}: num_layers must be positive, got {num_layers}.")
        self.num_layers = num_layers
        self.hyperparameters = hyperparameters
        self.layer_kwargs = dataclasses.asdict(hyperparameters)

    def build_layers(self, *shapes):
        """Creates and builds the N layers (and the final pre-LN norm) for these input shapes."""
        layers = []
        for i in range(self.num_layers):
            layer = self.layer_class(**self.layer_kwargs, dtype=self.dtype_policy, name=f"layer_{i}")
            layer.build(*shapes)
            layers.append(layer)
        self.final_norm = None
        if self.hyperparameters.norm_first:
            self.final_norm = LayerNormalization(
                epsilon=self.hyperparameters.layer_norm_epsilon, dtype=self.dtype_policy, name="final_norm"
            )
            self.final_norm.build(shapes[0])
        return layers

    def get_config(self):
        config = super().get_config()
        config.update({"num_layers": self.num_layers, **self.hyperparameters.to_config()})
        return config
