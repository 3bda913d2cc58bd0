"""The residual connection around every sublayer (Vaswani et al., 2017, §3.1, §5.4).

Post-LN, the paper's choice: `LayerNorm(x + Dropout(Sublayer(x)))`.
Pre-LN, an option (Xiong et al., 2020): `x + Dropout(Sublayer(LayerNorm(x)))`.
"""

import keras

from keras_transformer.layers.dropout import Dropout
from keras_transformer.layers.layer_norm import LayerNormalization


@keras.saving.register_keras_serializable(package="keras_transformer")
class SublayerConnection(keras.layers.Layer):
    """Residual dropout, residual add and layer normalization around one sublayer.

    "We apply dropout to the output of each sub-layer, before it is added to
    the sub-layer input and normalized" (§5.4).

    Usage inside a block: `y = sublayer(connection.normalize(x))`, then
    `x = connection(x, y)`. `normalize` is the identity for post-LN.

    Args:
        dropout: P_drop, the residual dropout rate.
        norm_first: pre-LN instead of the paper's post-LN.
        epsilon: LayerNorm epsilon.

    Call arguments:
        inputs: the sublayer input x `[B, T, D]`.
        sublayer_output: Sublayer(...) `[B, T, D]`.
        training: enables dropout.
    """

    def __init__(self, dropout=0.1, norm_first=False, epsilon=1e-6, **kwargs):
        super().__init__(**kwargs)
        self.dropout = dropout
        self.norm_first = norm_first
        self.epsilon = epsilon
        self.supports_masking = True

    def build(self, inputs_shape, sublayer_output_shape=None):
        self.layer_norm = LayerNormalization(epsilon=self.epsilon, dtype=self.dtype_policy, name="layer_norm")
        self.layer_norm.build(inputs_shape)
        self.residual_dropout = Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def normalize(self, inputs):
        """What the sublayer reads: LayerNorm(x) for pre-LN, x for post-LN."""
        return self.layer_norm(inputs) if self.norm_first else inputs

    def call(self, inputs, sublayer_output, training=None):
        residual = inputs + self.residual_dropout(sublayer_output, training=training)
        return residual if self.norm_first else self.layer_norm(residual)

    def compute_output_shape(self, inputs_shape, sublayer_output_shape=None):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "norm_first": self.norm_first, "epsilon": self.epsilon})
        return config
