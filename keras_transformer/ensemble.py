"""An ensemble of Transformers that share a vocabulary, decoded as one model (not in the paper).

At every step of greedy, beam or sampling search the ensemble's next-token
distribution combines its members' (fairseq's `--path a:b`, Marian's
`--models`, Sockeye's ensembles). The combination is log-linear, as
Sockeye's `log_linear` mode: the weighted mean of the members'
log-probabilities, normalized again,

    log P(y) = sum_i w_i log P_i(y) - log sum_y' exp(sum_i w_i log P_i(y')),   sum_i w_i = 1,

a weighted geometric mean of the members' distributions. (fairseq, and
Sockeye's default `linear` mode, average the probabilities instead:
log sum_i w_i P_i(y).) Since log P_i(y) = z_i(y) - logsumexp(z_i), where
z_i are member i's logits and the second term is the same for every token,
the weighted mean of the log-probabilities differs from the weighted mean
of the logits, sum_i w_i z_i, by a constant per row, which the
normalization removes. So the ensemble returns sum_i w_i z_i as its logits
and the search normalizes them as it does one model's (one softmax over the
vocabulary, not one per member). Why log-linear:

- an ensemble of a model with itself, at equal weights, gives exactly that
  model's logits (0.5 z + 0.5 z = z in floating point), so it translates
  exactly as the model does, scores included; weights (1, 0) give exactly
  the first model's;
- the search keeps its own fast paths (a bfloat16 model's logits stay in
  bfloat16, see `decoding.tokens.top_allowed_tokens`);
- ensembles nest: an ensemble's logits combine again as a member's would.

The members may differ in size (layers, width, heads) and position
encoding, not in vocabulary. Each encodes the source itself; the ensemble's
memory and decoder output are its members' side by side (`[..., sum D_i]`),
so the search handles them as one model's (`keras_transformer.decoding`
needs only `encode`, `decode`, `init_cache` and `decode_step`).
"""

import dataclasses
import math

from keras import ops

from keras_transformer.errors import ParameterError

# How `Ensemble` combines its members, as `export.json` records it.
COMBINATION = "log-linear"


def normalized_weights(weights, count):
    """The ensemble weights `weights` (None: equal) for `count` models, scaled to sum to 1, as a tuple.

    Raises:
        ParameterError: ("weights") not one per model, a negative or
            non-finite weight, or all zero.

    Example:
        >>> normalized_weights([1, 3], 2)
        (0.25, 0.75)
    """
    if weights is None:
        return (1.0 / count,) * count
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise ParameterError("weights", f"has {len(weights)} values for {count} models: give one weight per model.")
    bad = [w for w in weights if not 0.0 <= w < math.inf]
    if bad:
        raise ParameterError("weights", f"must be non-negative and finite, got {bad[0]:g}.")
    total = math.fsum(weights)
    if total <= 0.0:
        raise ParameterError("weights", "are all 0: at least one model must have a positive weight.")
    return tuple(weights) if total == 1.0 else tuple(w / total for w in weights)


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
    """What the search and the translator read of an `Ensemble`'s configuration, and its record.

    Attributes:
        members: each member's config (`TransformerConfig`, or an `EnsembleConfig`).
        weights: the normalized weights, one per member.
        names: each member's name (where it comes from).
    """

    members: tuple
    weights: tuple
    names: tuple

    @property
    def vocab_size(self):
        return self.members[0].vocab_size

    @property
    def d_model(self):
        """The width of the ensemble's memory and decoder output: its members' side by side."""
        return sum(config.d_model for config in self.members)

    @property
    def max_length(self):
        """The longest sequence every member takes (the translator's default source length)."""
        return min(config.max_length for config in self.members)

    @property
    def positional_encoding(self):
        """Learned if a member's positions are (its table bounds the output: `max_length`), else sinusoidal."""
        learned = any(config.positional_encoding == "learned" for config in self.members)
        return "learned" if learned else "sinusoidal"

    def to_dict(self):
        """The record `export.json` keeps as its `model`.

        `{"ensemble": {"combination": "log-linear", "members": [{"name", "weight", "model"}, ...]}}`.
        """
        members = [
            {"name": name, "weight": weight, "model": config.to_dict()}
            for name, weight, config in zip(self.names, self.weights, self.members)
        ]
        return {"ensemble": {"combination": COMBINATION, "members": members}}


class Ensemble:
    """Transformers of one vocabulary decoded as one model: their log-probabilities averaged at every step.

    Log-linear combination with weights (see the module docstring): the
    distribution is the normalized weighted geometric mean of the members'.
    Pass it wherever a `Transformer` is decoded: `decoding.beam_search`,
    `greedy_search`, `sampling_search`, `score_outputs`, `make_decode_fn`,
    or `inference.Translator` (which exports it as one SavedModel).

    Args:
        models: the members: `Transformer`s (or ensembles) with the same
            `config.vocab_size` and dtype policy. The caller checks that
            their vocabularies are the same (`inference.ensembles` compares
            the SentencePiece models).
        weights: one non-negative weight per model, scaled to sum to 1;
            default equal.
        names: what to call each member in errors and in `config.to_dict()`
            (e.g. the run directory it comes from); default "model 1", ...

    Raises:
        ParameterError: ("models") no model, or members of different
            vocabulary sizes or dtype policies; ("weights") see
            `normalized_weights`.

    Example:
    >>> from keras_transformer import Transformer, TransformerConfig
    >>> from keras_transformer.decoding import greedy_search
    >>> model = Transformer(TransformerConfig.tiny(vocab_size=100))
    >>> smaller = Transformer(TransformerConfig.tiny(vocab_size=100, d_model=32, num_heads=2))
    >>> source = ops.convert_to_tensor([[5, 6, 7, 3]])
    >>> same = greedy_search(Ensemble([model, model]), source, max_length=6)  # a model with itself
    >>> bool(ops.all(same[0] == greedy_search(model, source, max_length=6)[0]))
    True
    >>> token_ids, scores = greedy_search(Ensemble([model, smaller], weights=[2, 1]), source, max_length=6)
    """

    def __init__(self, models, weights=None, names=None):
        self.members = tuple(models)
        if not self.members:
            raise ParameterError("models", "is empty: an ensemble needs at least one model.")
        self.weights = normalized_weights(weights, len(self.members))
        self.names = tuple(names) if names is not None else tuple(f"model {i + 1}" for i in range(len(self.members)))
        if len(self.names) != len(self.members):
            raise ValueError(f"names has {len(self.names)} entries for {len(self.members)} models.")
        first, name = self.members[0], self.names[0]
        for other, other_name in zip(self.members[1:], self.names[1:]):
            if other.config.vocab_size != first.config.vocab_size:
                raise ParameterError(
                    "models",
                    f"{name} has {first.config.vocab_size} tokens, {other_name} {other.config.vocab_size}: "
                    "an ensemble's models must share one vocabulary.",
                )
            if other.dtype_policy.name != first.dtype_policy.name:
                raise ParameterError(
                    "models",
                    f"{name} computes in {first.dtype_policy.name}, {other_name} in {other.dtype_policy.name}: "
                    "load an ensemble's models in one precision.",
                )
        self.config = EnsembleConfig(tuple(m.config for m in self.members), self.weights, self.names)
        self._widths = tuple(m.config.d_model for m in self.members)

    @classmethod
    def from_config(cls, values, dtype=None):
        """A new ensemble (fresh weights) from `config.to_dict()`'s record, members built under `dtype`."""
        from keras_transformer.config import TransformerConfig
        from keras_transformer.model import Transformer

        members = values["ensemble"]["members"]
        models = [
            cls.from_config(m["model"], dtype)
            if "ensemble" in m["model"]
            else Transformer(TransformerConfig.from_dict(m["model"]), **({"dtype": dtype} if dtype else {}))
            for m in members
        ]
        return cls(models, [m["weight"] for m in members], [m["name"] for m in members])

    # What the search and the export read of a model ------------------------------------

    @property
    def dtype_policy(self):
        return self.members[0].dtype_policy

    @property
    def compute_dtype(self):
        return self.members[0].compute_dtype

    @property
    def variables(self):
        """Every member's variables, member after member (what an export saves and restores, in order)."""
        return [variable for member in self.members for variable in member.variables]

    # The decoding interface of `Transformer` -------------------------------------------

    def encode(self, source_ids, training=None):
        """Each member's memory of `source_ids [B, S]`, side by side: `[B, S, sum d_model]`."""
        return ops.concatenate([m.encode(source_ids, training=training) for m in self.members], axis=-1)

    def decode(self, target_ids, memory, source_ids, training=None, logits_dtype="float32"):
        """The combined logits `[B, T, V]` of every position (as `Transformer.decode`)."""
        logits = [
            member.decode(target_ids, part, source_ids, training=training, logits_dtype="float32")
            for member, part in zip(self.members, self._split(memory))
        ]
        return self._combine(logits, logits_dtype)

    def init_cache(self, memory, max_length):
        """The members' caches: `{"self": (...), "members": (...), "shared": (...)}`, one entry per member each.

        "self" holds each member's self-attention cache and "shared" what it
        shares across sentences (as `Transformer.init_cache`'s); "members"
        the rest (the cross-attention keys and values), with a batch axis.
        """
        caches = [member.init_cache(part, max_length) for member, part in zip(self.members, self._split(memory))]
        return {
            "self": tuple(cache["self"] for cache in caches),
            "members": tuple({k: v for k, v in cache.items() if k not in ("self", "shared")} for cache in caches),
            "shared": tuple(cache.get("shared", {}) for cache in caches),
        }

    def decode_step(
        self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None, project=True
    ):
        """Every member's `decode_step`: `(combined logits [B, T, V], new cache)` (as `Transformer.decode_step`).

        `project=False` returns the members' decoder outputs side by side,
        `[B, T, sum d_model]`, for `step_logits`.
        """
        outputs, selves = [], []
        for i, (member, part) in enumerate(zip(self.members, self._split(memory))):
            member_cache = {"self": cache["self"][i], **cache["members"][i], "shared": cache["shared"][i]}
            output, new_cache = member.decode_step(
                target_ids,
                part,
                source_ids,
                member_cache,
                cache_index,
                positions=positions,
                self_attention_mask=self_attention_mask,
                project=project,
            )
            outputs.append(output)
            selves.append(new_cache["self"])
        new_cache = {**cache, "self": tuple(selves)}
        if project:
            return self._combine(outputs, "float32"), new_cache
        return ops.concatenate(outputs, axis=-1), new_cache

    def step_logits(self, decoder_output, cache, dtype="float32"):
        """The combined logits `[..., V]` of `decode_step(..., project=False)`'s output, in `dtype` (None: compute)."""
        shared = cache.get("shared") or ({},) * len(self.members)
        logits = [
            member.step_logits(part, {"shared": member_shared}, dtype=None)
            for member, part, member_shared in zip(self.members, self._split(decoder_output), shared)
        ]
        return self._combine(logits, dtype)

    def _split(self, tensor):
        """`[..., sum d_model]` -> each member's `[..., d_model]`."""
        parts, start = [], 0
        for width in self._widths:
            parts.append(tensor[..., start : start + width])
            start += width
        return parts

    def _combine(self, logits, dtype):
        """`sum_i w_i z_i`, accumulated in float32, in `dtype` (None: the compute dtype)."""
        total = None
        for weight, member_logits in zip(self.weights, logits):
            term = ops.cast(member_logits, "float32") * weight
            total = term if total is None else total + term
        dtype = self.compute_dtype if dtype is None else dtype
        return total if dtype == "float32" else ops.cast(total, dtype)
