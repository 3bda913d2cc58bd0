"""Position-wise feed-forward network (Vaswani et al., 2017, §3.3).

    FFN(x) = max(0, x W_1 + b_1) W_2 + b_2

"This consists of two linear transformations with a ReLU activation in
between", applied to each position separately and identically.
"""

import keras

from keras_transformer.kernels.matmul import apply_to_rows
from keras_transformer.layers.initialization import initializer_for_weight


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
        return apply_to_rows(self.ffn, inputs)  # every position alike: one 2-D matmul per map (`kernels.matmul`)

    def ffn(self, x):
        """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2 (§3.3) of the positions `x [..., d_model]`."""
        hidden = self.inner(x)  # max(0, x W_1 + b_1), or the configured activation
        return self.outer(hidden)  # hidden W_2 + b_2

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
