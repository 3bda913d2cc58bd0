"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3).

FFN(x) = max(0, x W_1 + b_1) W_2 + b_2
"""

import keras

from keras_transformer.layers.initialization import initializer_for_weight
from keras_transformer.layers.position_wise import apply_to_rows


@keras.saving.register_keras_serializable(package="keras_transformer")
class FeedForward(keras.layers.Layer):
    """Two linear maps with a ReLU between, applied to each position alike (§3.3).

    Args:
        d_ff: inner width (2048 in the base model).
        output_dim: output width; default the input width (d_model).
        activation: "relu" in the paper; any Keras activation works.
        kernel_initializer: initializer of W_1 and W_2; each gets its own
            copy (`initializer_for_weight`), so W_2 is not W_1 reshaped. The
            config keeps the initializer as given.

    Call arguments:
        inputs: `[B, T, d_model]`.

    Returns:
        `[B, T, output_dim]`.

    Example:
    >>> ffn = FeedForward(d_ff=2048)
    >>> tuple(ffn(keras.random.normal((2, 7, 512))).shape)
    (2, 7, 512)
    >>> ffn.count_params()  # W_1, b_1, W_2, b_2 of the base model: 512*2048 + 2048 + 2048*512 + 512
    2099712
    """

    def __init__(self, d_ff, output_dim=None, activation="relu", kernel_initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if d_ff <= 0:
            raise ValueError(f"{self.name}: d_ff must be positive, got {d_ff}.")
        self.d_ff = d_ff
        self.output_dim = output_dim
        self.activation = keras.activations.get(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, input_shape):
        self.inner = keras.layers.Dense(
            self.d_ff,
            activation=self.activation,
            kernel_initializer=initializer_for_weight(self.kernel_initializer, 0),
            dtype=self.dtype_policy,
            name="inner",
        )
        self.inner.build(input_shape)
        self.outer = keras.layers.Dense(
            self.output_dim or input_shape[-1],
            kernel_initializer=initializer_for_weight(self.kernel_initializer, 1),
            dtype=self.dtype_policy,
            name="outer",
        )
        self.outer.build(tuple(input_shape[:-1]) + (self.d_ff,))
        self.built = True

    def call(self, inputs):
        # Positions are independent (§3.3), so the two maps run on `[B*T, D]`
        # rows: a 2-D matmul lets TensorFlow's oneDNN rewrite fuse the bias
        # and ReLU into it (no separate BiasAdd and Relu passes), which a
        # rank-3 input's reshape between the ops prevents.
        return apply_to_rows(lambda rows: self.outer(self.inner(rows)), inputs)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "d_ff": self.d_ff,
                "output_dim": self.output_dim,
                "activation": keras.activations.serialize(self.activation),
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config
