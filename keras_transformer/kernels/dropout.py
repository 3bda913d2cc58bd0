"""Exact-rate dropout (Srivastava et al., 2014; Vaswani et al., 2017, §5.4).

The plain form of dropout keeps each value with probability 1 - rate and
scales the kept ones by 1 / (1 - rate). Keras draws its keep decisions as
uniform numbers in the layer's compute dtype: under mixed_bfloat16 those
have 8 significant bits, and the share it drops differs from the rate
(`benchmarks/dropout.py`). The form here draws each keep decision as random
integers, exact in every dtype: 16 bits per decision, two decisions per
32-bit random number, with the rate rounded to a multiple of 2^-16 (2^-32
for rates within 2^-8 of 0 or 1, where that rounding would be coarse); kept
values are scaled by 1 / the kept share so drawn. TensorFlow only
(`exact_rate_dropout_runs`). Given its keep mask, it equals the plain form in
value and gradient (`tests/test_kernels.py`).
"""

import keras
from keras import ops


def exact_rate_dropout_runs(rate, noise_shape):
    """Whether `exact_rate_dropout` applies: on TensorFlow, without `noise_shape`, for a rate in (0, 1)."""
    return noise_shape is None and 0 < rate < 1 and keras.backend.backend() == "tensorflow"


def exact_rate_dropout(inputs, rate, seed):
    """`inputs` with each value kept (and scaled by 1 / the kept share) or zeroed; TensorFlow only.

    Args:
        inputs: any shape and float dtype.
        rate: the share to drop, in (0, 1).
        seed: the stateless seed, e.g. `SeedGenerator.next()`.

    Returns:
        A tensor of `inputs`' shape and dtype.
    """
    keep, kept_share = keep_mask(inputs, rate, seed)
    scale = ops.cast(1.0 / kept_share, inputs.dtype)
    return inputs * ops.where(keep, scale, ops.zeros((), inputs.dtype))


def keep_mask(inputs, rate, seed):
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
    # 16 bits decide well enough, and one Philox number then decides two elements.
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
