"""The encoder-decoder Transformer as a `keras.Model` (Vaswani et al., 2017, §3, Figure 1).

    source ids -> embedding * sqrt(d_model) + PE -> dropout -> Encoder -> memory
    target ids -> embedding * sqrt(d_model) + PE -> dropout -> Decoder(memory)
               -> pre-softmax projection (shared with the embeddings) -> logits

Token id 0 is padding everywhere; every mask is derived from the ids.
"""

import dataclasses
from typing import NamedTuple

import keras
from keras import ops

from keras_transformer.config import TransformerConfig
from keras_transformer.layers import (
    Decoder,
    Dropout,
    Encoder,
    LearnedPositionalEmbedding,
    PositionalEncoding,
    SharedEmbedding,
)
from keras_transformer.layers.base import LayerHyperparameters
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.optimization import create_optimizer
from keras_transformer.special_ids import PAD_ID


class TransformerAttention(NamedTuple):
    """What `Transformer.attention_weights` returns: each layer's attention weights.

    Attributes:
        encoder: encoder self-attention, a list of `[B, h, S, S]`.
        decoder: masked decoder self-attention, a list of `[B, h, T, T]`.
        cross: encoder-decoder attention, a list of `[B, h, T, S]`.
    """

    encoder: list
    decoder: list
    cross: list


def _real_tokens(token_ids):
    """The padding mask of `token_ids`: True at real tokens (id 0 pads)."""
    return ops.not_equal(token_ids, PAD_ID)


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of Figure 1 for sequence-to-sequence learning.

    Args:
        config: a `TransformerConfig` (or its dict).

    Call arguments:
        inputs: `(source_ids [B, S], target_ids [B, T])`, int, 0-padded.
            `target_ids` is the decoder input (start token, then the target
            shifted right).
        training: enables dropout.

    Returns:
        logits `[B, T, vocab_size]` in the compute dtype (float32, or bf16
        under `mixed_bfloat16`; `decode`/`decode_step` return float32).

    `compile()` with no arguments sets up the paper's training: Adam with
    `TransformerSchedule` (§5.3), `LabelSmoothedCrossEntropy` (§5.4) and
    `MaskedAccuracy`; any argument overrides its part.

    For decoding (see `keras_transformer.decoding`): `encode`,
    `init_cache`, `decode_step`; for inspection, `attention_weights`.

    Example:
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=1000))
    >>> model.compile()
    >>> source_ids = ops.array([[5, 6, 7, 3], [8, 9, 3, 0]])  # 0 pads, 3 ends
    >>> target_ids = ops.array([[2, 10, 11], [2, 12, 0]])     # 2 starts
    >>> tuple(model((source_ids, target_ids)).shape)         # [B, T, vocab_size]
    (2, 3, 1000)
    """

    def __init__(self, config, **kwargs):
        # Its inputs are token ids: with autocast, Keras casts ids that arrive as floats to the compute dtype,
        # and bfloat16 holds integers exactly only up to 256. Each sublayer still autocasts its own variables.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        self.config = config
        c = config
        if c.share_embeddings:
            shared = SharedEmbedding(c.vocab_size, c.d_model, dtype=self.dtype_policy, name="shared_embedding")
            self.source_embedding = self.target_embedding = self.output_projection = shared
        else:
            self.source_embedding = SharedEmbedding(
                c.vocab_size, c.d_model, dtype=self.dtype_policy, name="source_embedding"
            )
            self.target_embedding = SharedEmbedding(
                c.vocab_size, c.d_model, dtype=self.dtype_policy, name="target_embedding"
            )
            self.output_projection = SharedEmbedding(
                c.vocab_size, c.d_model, scale=False, dtype=self.dtype_policy, name="output_projection"
            )
        if c.positional_encoding == "sinusoidal":
            self.source_positions = self.target_positions = PositionalEncoding(
                dtype=self.dtype_policy, name="positional_encoding"
            )
        else:
            self.source_positions = LearnedPositionalEmbedding(
                c.max_length, dtype=self.dtype_policy, name="source_positions"
            )
            self.target_positions = LearnedPositionalEmbedding(
                c.max_length, dtype=self.dtype_policy, name="target_positions"
            )
        # "We apply dropout to the sums of the embeddings and the positional encodings" (§5.4).
        self.source_dropout = Dropout(c.dropout, dtype=self.dtype_policy, name="source_dropout")
        self.target_dropout = Dropout(c.dropout, dtype=self.dtype_policy, name="target_dropout")
        stack = dict(num_layers=c.num_layers, **dataclasses.asdict(LayerHyperparameters.of(c)), dtype=self.dtype_policy)
        self.encoder = Encoder(**stack, name="encoder")
        self.decoder = Decoder(**stack, name="decoder")
        # Every shape is known from the config: create the weights now, so that
        # encode / init_cache / decode_step work before any full call.
        self.build()

    def build(self, input_shape=None):
        if self.built:
            return
        d_model = self.config.d_model
        embedded = (None, None, d_model)
        embeddings = (self.source_embedding, self.target_embedding, self.output_projection)
        for layer in {id(layer): layer for layer in embeddings}.values():
            layer.build()
        positions = (self.source_positions, self.target_positions)
        for layer in {id(layer): layer for layer in positions}.values():
            layer.build(embedded)
        self.encoder.build(embedded)
        self.decoder.build(embedded, embedded)
        self.built = True

    # The three parts of Figure 1 ---------------------------------------------------

    def encode(self, source_ids, training=None):
        """Encoder stack: `source_ids [B, S]` -> memory `[B, S, d_model]`."""
        return self.encoder(
            self._embed_source(source_ids, training), padding_mask=_real_tokens(source_ids), training=training
        )

    def decode(self, target_ids, memory, source_ids, training=None, logits_dtype="float32"):
        """Decoder stack and output projection: logits `[B, T, vocab_size]` for every position.

        `logits_dtype=None` leaves them in the compute dtype (see `call`).
        """
        y = self.decoder(
            self._embed_target(target_ids, training),
            memory,
            memory_padding_mask=_real_tokens(source_ids),
            padding_mask=_real_tokens(target_ids),
            training=training,
        )
        return self._logits(y, logits_dtype)

    def attention_weights(self, source_ids, target_ids):
        """Every attention's weights for one forward pass at inference, as a `TransformerAttention`.

        Args:
            source_ids: int `[B, S]`, 0-padded.
            target_ids: int `[B, T]`, the decoder inputs (start token, then
                the target shifted right).

        Returns:
            `TransformerAttention(encoder, decoder, cross)`: per layer,
            `[B, h, S, S]`, `[B, h, T, T]` and `[B, h, T, S]` weights.

        Example:
        >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
        >>> weights = model.attention_weights(ops.array([[5, 6, 3]]), ops.array([[2, 7]]))
        >>> len(weights.encoder), tuple(weights.cross[0].shape)  # N layers; [B, h, T, S]
        (2, (1, 4, 2, 3))
        """
        encoded = self.encoder.encode(
            self._embed_source(source_ids, False), padding_mask=_real_tokens(source_ids), training=False
        )
        decoded = self.decoder.decode(
            self._embed_target(target_ids, False),
            encoded.output,
            memory_padding_mask=_real_tokens(source_ids),
            padding_mask=_real_tokens(target_ids),
            training=False,
        )
        return TransformerAttention(
            encoded.attention_weights, decoded.self_attention_weights, decoded.cross_attention_weights
        )

    def _embed_source(self, source_ids, training):
        """Source embeddings plus positions, with dropout (§3.4, §3.5, §5.4)."""
        x = self.source_embedding(source_ids)
        return self.source_dropout(self.source_positions(x), training=training)

    def _embed_target(self, target_ids, training):
        """Target embeddings plus positions, with dropout (§3.4, §3.5, §5.4)."""
        y = self.target_embedding(target_ids)
        return self.target_dropout(self.target_positions(y), training=training)

    def _logits(self, y, dtype="float32", transposed_kernel=None):
        logits = self.output_projection.project(y, transposed_kernel)
        return logits if dtype is None else ops.cast(logits, dtype)

    def call(self, inputs, training=None):
        source_ids, target_ids = inputs
        memory = self.encode(source_ids, training=training)
        # Logits stay in the compute dtype: a bf16 matmul's output is already
        # rounded to bf16, so casting here adds no precision, only two passes
        # over the largest tensor of the step (forward and backward). The
        # softmax that needs float32 casts on its own: our loss inside its
        # compiled kernel, Keras' losses on entry, decoding in `decode_step`.
        return self.decode(target_ids, memory, source_ids, training=training, logits_dtype=None)

    # Incremental decoding ------------------------------------------------------------

    def init_cache(self, memory, max_length):
        """Cache for decoding up to `max_length` steps against `memory`.

        Outside XLA, `max_length=0` gives an empty self-attention cache that
        grows with each `decode_step` (what graph-mode beam search uses).
        The decoder's self- and cross-attention caches (`Decoder.init_cache`,
        with a batch axis) and `"shared"`, what every sentence uses alike (no
        batch axis), computed once for the whole search: `"output_kernel"`,
        the pre-softmax matrix transposed (`SharedEmbedding.project`), and
        `"decoder_projections"`, the attentions' input projections
        (`Decoder.input_projections`: W^Q scaled, W^Q W^K W^V fused). A
        while loop would recompute both at every step.
        """
        cache = self.decoder.init_cache(memory, max_length)
        cache["shared"] = {
            "output_kernel": self.output_projection.transposed_kernel(),
            "decoder_projections": self.decoder.input_projections(),
        }
        return cache

    def decode_step(
        self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None, project=True
    ):
        """Decodes the steps `cache_index .. cache_index + T - 1` given the cache of earlier steps.

        Args:
            target_ids: int `[B, T]` (T = 1 when decoding token by token).
            memory: encoder output `[B, S, d_model]`.
            source_ids: `[B, S]`, for the source padding mask.
            cache: from `init_cache` or the previous step.
            cache_index: int scalar, cache slot of `target_ids[:, 0]`; the T
                inputs fill slots `cache_index .. cache_index + T - 1`.
            positions: int `[T]`, the inputs' positions in the output sequence
                (§3.5); default the cache slots. Beam search feeds the K
                hypotheses of step i side by side (T = K, all at position i).
            self_attention_mask: bool `[B, T, slots]`, the cache slots each
                input may attend to (slots: `max_length`, or `cache_index + T`
                for a growing cache); default the look-ahead mask (§3.2.3)
                from `cache_index`.
            project: False returns the decoder output `[B, T, d_model]`
                instead of the logits; `step_logits(output, new_cache)` then
                projects it (beam search projects only the hypotheses that
                can still change its result).

        Returns:
            `(logits [B, T, vocab_size], new_cache)`; the logits equal those of
            the full forward pass at the same positions.
        """
        y = self.target_embedding(target_ids)
        y = self.target_positions(y, start_index=cache_index, positions=positions)
        decoded = self.decoder.decode(
            y,
            memory,
            memory_padding_mask=_real_tokens(source_ids),
            cache=cache,
            cache_index=cache_index,
            self_attention_mask=self_attention_mask,
            training=False,
        )
        y, cache = decoded.output, decoded.cache
        return (self.step_logits(y, cache) if project else y), cache

    def step_logits(self, decoder_output, cache, dtype="float32"):
        """The logits `[..., vocab_size]` of `decode_step(..., project=False)`'s output (§3.4's projection).

        In float32, or in `dtype`; None keeps the compute dtype (the search
        takes bfloat16 logits as they are, see `top_allowed_tokens`).
        """
        return self._logits(decoder_output, dtype, transposed_kernel=cache.get("shared", {}).get("output_kernel"))

    # Training setup --------------------------------------------------------------------

    def compile(self, optimizer=None, loss=None, metrics=None, **kwargs):
        """Keras `compile`, defaulting to the paper's training (§5.3, §5.4)."""
        c = self.config
        super().compile(
            optimizer=optimizer if optimizer is not None else create_optimizer(c.d_model),
            loss=loss if loss is not None else LabelSmoothedCrossEntropy(c.label_smoothing),
            metrics=metrics if metrics is not None else [MaskedAccuracy()],
            **kwargs,
        )

    def compile_from_config(self, config):
        """Recompiles a reloaded `.keras` model with the optimizer, loss and metrics it was saved with."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        config = super().get_config()
        config["config"] = self.config.to_dict()
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        model_config = TransformerConfig.from_dict(config.pop("config"))
        base = {k: config[k] for k in ("name", "dtype", "trainable") if k in config}
        return cls(model_config, **base)
