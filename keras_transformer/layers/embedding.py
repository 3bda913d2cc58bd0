"""Token embeddings and the pre-softmax projection (Vaswani et al., 2017, §3.4).

"We use learned embeddings to convert the input tokens and output tokens to
vectors of dimension d_model. [...] we share the same weight matrix between
the two embedding layers and the pre-softmax linear transformation [...]. In
the embedding layers, we multiply those weights by sqrt(d_model)."
"""

import math

import keras
from keras import ops

from keras_transformer.kernels.matmul import position_wise_matmul
from keras_transformer.layers.initialization import initializer_for_weight


@keras.saving.register_keras_serializable(package="keras_transformer")
class SharedEmbedding(keras.layers.Layer):
    """A token embedding matrix that is also the pre-softmax projection (§3.4).

    `layer(ids)` looks tokens up and multiplies by sqrt(d_model);
    `layer.project(x)` returns the logits `x E^T`. One instance used for the
    source, the target and the output shares one matrix between all three, as
    the paper does; separate instances give separate matrices.

    The lookup reads the float32 matrix even under a mixed precision policy and
    casts the gathered rows: the gradient of a gather is a scatter-add, which
    is slow and lossy in bfloat16.

    Args:
        vocab_size: number of tokens; id 0 is padding.
        d_model: embedding width.
        scale: multiply looked-up embeddings by sqrt(d_model) (§3.4).
        embeddings_initializer: default normal with stddev d_model^-0.5, so
            that the scaled embeddings have unit variance like the positional
            encodings they are added to (the paper does not state its
            initializer; this is tensor2tensor's).

    Call arguments:
        token_ids: int `[B, T]`.

    Returns:
        `[B, T, d_model]` in the layer's compute dtype.

    Example:
    >>> embedding = SharedEmbedding(vocab_size=8000, d_model=256)
    >>> x = embedding(ops.ones((2, 5), dtype="int32"))
    >>> logits = embedding.project(x)
    >>> tuple(x.shape), tuple(logits.shape), len(embedding.weights)  # one matrix for both
    ((2, 5, 256), (2, 5, 8000), 1)
    """

    def __init__(self, vocab_size, d_model, scale=True, embeddings_initializer=None, **kwargs):
        # The layer's autocast=False keeps token ids that arrive as floats exact: Keras would cast them to
        # the compute dtype, and bfloat16 holds integers exactly only up to 256. The matrix is built with
        # autocast=False too (see `build`).
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if vocab_size <= 0 or d_model <= 0:
            raise ValueError(f"{self.name}: vocab_size and d_model must be positive, got {vocab_size} and {d_model}.")
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.scale = scale
        self.embeddings_initializer = keras.initializers.get(
            embeddings_initializer or keras.initializers.RandomNormal(stddev=d_model**-0.5)
        )

    def build(self, input_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            # A copy: an instance passed to several layers gives each its own matrix.
            initializer=initializer_for_weight(self.embeddings_initializer),
            # Gather from the float32 matrix and cast after (see class docstring). The variable's flag, not
            # the layer's: Keras autocasts a mixed layer's variables when it is called outside any other
            # layer (a decoding step, a user's own code), whatever the layer's autocast.
            autocast=False,
        )
        self.built = True

    def call(self, token_ids):
        if not self.built:
            self.build()
        # Cast, not refused: Keras builds models from shapes with float placeholders.
        token_ids = ops.cast(token_ids, "int32")
        vectors = ops.take(self.embeddings, token_ids, axis=0)
        if self.scale:
            vectors = vectors * math.sqrt(self.d_model)
        return ops.cast(vectors, self.compute_dtype)

    def transposed_kernel(self):
        """The matrix `project` multiplies by: the embeddings transposed, `[d_model, vocab_size]`."""
        if not self.built:
            self.build()
        return ops.transpose(ops.cast(self.embeddings, self.compute_dtype))

    def project(self, x, transposed_kernel=None):
        """The pre-softmax linear transformation: `[..., d_model] -> [..., vocab_size]` logits.

        `transposed_kernel`: `transposed_kernel()` computed beforehand. Decoding
        transposes once per search instead of at every step, since a matmul
        by a materialized matrix is cheaper than one by a transposed operand
        (measurements: `benchmarks/README.md`).
        """
        kernel = self.transposed_kernel() if transposed_kernel is None else transposed_kernel
        return position_wise_matmul(ops.cast(x, self.compute_dtype), kernel)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape) + (self.d_model,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "scale": self.scale,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            }
        )
        return config
