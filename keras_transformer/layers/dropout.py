"""Dropout (Srivastava et al., 2014; Vaswani et al., 2017, §5.4).

"We apply dropout to the output of each sub-layer, before it is added to the
sub-layer input and normalized. In addition, we apply dropout to the sums of
the embeddings and the positional encodings" (§5.4), P_drop = 0.1 in the
base model. Each value is kept with probability 1 - P_drop and scaled by
1 / (1 - P_drop), or zeroed; at inference dropout is the identity.

On TensorFlow the keep decisions are drawn by
`keras_transformer.kernels.dropout.exact_rate_dropout`, so the share
dropped is the rate in every dtype.
"""

import keras

from keras_transformer.kernels import dropout as kernels


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with an exact rate under every dtype policy.

    During training, each element is kept with probability 1 - rate and
    scaled by 1 / (1 - rate), zeroed otherwise; at inference the layer is
    the identity. Same arguments, config and seed generator as Keras'
    layer. On TensorFlow, without `noise_shape`, the keep decisions are
    random integers compared with the rate rounded to a multiple of 2^-16
    (of 2^-32 for rates within 2^-8 of 0 or 1, where that rounding would
    be coarse), and kept values are scaled by 1 / the kept share so drawn
    (`kernels.dropout.exact_rate_dropout`). Other backends and
    `noise_shape` use Keras' own dropout.

    In a 16-bit compute dtype the scale is rounded to that dtype like any
    product: 1 / 0.9 is 1.109375 in bfloat16, so the output's expectation
    is 0.9984 of the input (Keras' dropout: 0.9968, its rate and its scale
    both off).

    Args:
        rate: fraction of the inputs to drop, in [0, 1].
        noise_shape: as in `keras.layers.Dropout`.
        seed: int seed of the layer's `keras.random.SeedGenerator`.

    Call arguments:
        inputs: any shape.
        training: drop only when True.

    Returns:
        A tensor of `inputs`' shape and dtype.

    Example:
    >>> from keras import ops
    >>> layer = Dropout(0.25, seed=1)
    >>> y = layer(ops.ones((1000, 64)), training=True)
    >>> sorted({float(v) for v in ops.unique(y)})  # dropped, or kept and scaled by 1 / 0.75
    [0.0, 1.3333333730697632]

    References:
        Srivastava et al., "Dropout: A Simple Way to Prevent Neural Networks
        from Overfitting", JMLR 2014. Vaswani et al., 2017, §5.4.
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        if kernels.exact_rate_dropout_runs(self.rate, self.noise_shape):
            return kernels.exact_rate_dropout(inputs, self.rate, self.seed_generator.next())
        return super().call(inputs, training=training)
