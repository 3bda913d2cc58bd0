"""Dropout that drops exactly its rate in every dtype (Srivastava et al., 2014; Vaswani et al., 2017, §5.4).

The Transformer applies dropout to every sublayer's output and to the sums
of embeddings and positional encodings, P_drop = 0.1 in the base model
(§5.4): 17 dropouts per training step in the small model, 32 in base.

Keras' dropout draws its uniform numbers in the layer's compute dtype.
Under mixed_bfloat16 those have 8 significant bits, and at rate 0.1 it
drops 10.15% of the values, not 10% (`benchmarks/dropout.py`): the model
trains with another rate than the one it was given. Drawing each keep
decision as random integers instead makes the rate exact in every dtype,
and costs less: two decisions per 32-bit random number, and one
multiplication by the mask forward and one backward.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras_transformer")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` with an exact rate under every dtype policy.

    During training, each element is kept with probability 1 - rate and
    scaled by 1 / (1 - rate), zeroed otherwise; at inference the layer is
    the identity. Same arguments, config and seed generator as Keras'
    layer. On TensorFlow, without `noise_shape`, the keep decisions are
    random integers compared with the rate rounded to a multiple of 2^-16
    (of 2^-32 for rates within 2^-8 of 0 or 1, where that rounding would
    be coarse), and kept values are scaled by 1 / the kept share so drawn.
    Other backends and `noise_shape` use Keras' own dropout.

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

    Example:
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
        if self.noise_shape is not None or self.rate >= 1 or keras.backend.backend() != "tensorflow":
            return super().call(inputs, training=training)
        keep, kept_share = _keep_mask(inputs, self.rate, self.seed_generator.next())
        scale = ops.cast(1.0 / kept_share, inputs.dtype)
        return inputs * ops.where(keep, scale, ops.zeros((), inputs.dtype))


def _keep_mask(inputs, rate, seed):
    """`(keep, kept_share)`: a bool tensor of `inputs`' shape, True with probability `kept_share`.

    `kept_share` is 1 - rate with the rate rounded to a multiple of 2^-16,
    or of 2^-32 for rates within 2^-8 of 0 or 1, where 16 bits would round
    the rate (or 1 - rate) by more than 0.2%.
    """
    import tensorflow as tf

    if seed.dtype != tf.int32:  # TF's stateless ops take int32 seeds; Keras keeps them in an int64 variable
        seed = tf.cast(tf.math.floormod(seed, tf.int32.max - 1), tf.int32)
    shape = tf.shape(inputs)
    if not 2.0**-8 <= rate <= 1 - 2.0**-8:
        threshold = max(1, min(round(rate * 2**32), 2**32 - 1))
        bits = tf.random.stateless_uniform(shape, seed, minval=None, maxval=None, dtype=tf.uint32)
        return bits >= tf.constant(threshold, tf.uint32), 1.0 - threshold / 2**32
    # 16 bits decide well enough, and one Philox number then decides two elements:
    # half the random numbers, the largest cost of a dropout.
    threshold = round(rate * 2**16)
    last = inputs.shape[-1] if inputs.shape.rank else None
    if last is not None and last % 2 == 0:  # [..., D / 2] uint32 -> [..., D / 2, 2] uint16 -> [..., D]
        half_shape = tf.concat([shape[:-1], [last // 2]], axis=0)
        bits = tf.random.stateless_uniform(half_shape, seed, minval=None, maxval=None, dtype=tf.uint32)
        bits = tf.reshape(tf.bitcast(bits, tf.uint16), shape)
    else:  # any other shape: ceil(n / 2) numbers, flattened, the last half-number unused when n is odd
        size = tf.size(inputs)
        bits = tf.random.stateless_uniform([(size + 1) // 2], seed, minval=None, maxval=None, dtype=tf.uint32)
        bits = tf.reshape(tf.reshape(tf.bitcast(bits, tf.uint16), [-1])[:size], shape)
    return bits >= tf.constant(threshold, tf.uint16), 1.0 - threshold / 2**16
