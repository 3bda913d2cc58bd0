"""Adam's update (§5.3) as TensorFlow's one fused kernel per variable.

The paper trains with Adam (Kingma & Ba, 2015), beta_1 = 0.9, beta_2 = 0.98,
epsilon = 1e-9. Keras' Adam writes the update, with the "epsilon hat" of
Kingma & Ba's §2,

    m <- beta_1 m + (1 - beta_1) g,   v <- beta_2 v + (1 - beta_2) g^2
    w <- w - lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) * m / (sqrt(v) + epsilon)

as about seventeen small ops per variable, more than a thousand op launches
per training step for a Transformer. TensorFlow's `ResourceApplyAdam`
kernel computes the same update in one op and one pass over the variable.
`keras_transformer.optimization.FusedAdam` calls `fused_update` where
`fused_update_applies`. `tests/test_kernels_adam.py` checks that it leaves
the same weights as `keras.optimizers.Adam`. Measurements are in
`benchmarks/README.md`.
"""

import keras

from keras_transformer import compat


def fused_update_applies(optimizer, gradient):
    """Whether `fused_update` can apply `gradient`: a dense gradient, TensorFlow backend, no `amsgrad`.

    Args:
        optimizer: a `keras.optimizers.Adam`.
        gradient: the gradient of one variable.

    Returns:
        bool. Sparse gradients (`tf.IndexedSlices`), `amsgrad` and other
        backends take Keras' own update.
    """
    if keras.backend.backend() != "tensorflow" or optimizer.amsgrad:
        return False
    import tensorflow as tf

    return not isinstance(gradient, tf.IndexedSlices)


def fused_update(optimizer, gradient, variable, learning_rate):
    """Applies Keras' Adam update of `optimizer` to `variable` with TensorFlow's `ResourceApplyAdam`.

    The optimizer's own moments are updated, and its step counter is read
    as Keras' Adam reads it (`iterations + 1`).

    Args:
        optimizer: a built `keras.optimizers.Adam` whose variables include
            `variable`'s moments.
        gradient: a dense gradient, the shape of `variable`.
        variable: the `keras.Variable` to update.
        learning_rate: this step's learning rate.
    """
    import tensorflow as tf

    momentum, velocity = compat.adam_moments(optimizer, variable)
    dtype = variable.dtype
    step = tf.cast(optimizer.iterations + 1, dtype)

    def constant(value):
        return tf.cast(value, dtype)

    tf.raw_ops.ResourceApplyAdam(
        var=_handle(variable),
        m=_handle(momentum),
        v=_handle(velocity),
        beta1_power=tf.pow(constant(optimizer.beta_1), step),
        beta2_power=tf.pow(constant(optimizer.beta_2), step),
        lr=tf.cast(learning_rate, dtype),
        beta1=constant(optimizer.beta_1),
        beta2=constant(optimizer.beta_2),
        epsilon=constant(optimizer.epsilon),
        grad=tf.cast(gradient, dtype),
    )


def _handle(variable):
    """The TF resource handle behind a Keras variable (the local copy under a distribution strategy)."""
    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle
