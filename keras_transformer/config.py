"""Model hyperparameters, named as in the paper (Vaswani et al., 2017, Table 3).

`TransformerConfig` is a plain dataclass: it validates itself on creation and
converts to and from a JSON-friendly dict, so a run directory can hold it.

Presets:

| preset | N | d_model | h | d_ff | P_drop | params (vocab 37k) | source |
|--------|---|---------|---|------|--------|--------------------|--------|
| base   | 6 | 512     | 8 | 2048 | 0.1    | ~63M               | Table 3 "base" |
| big    | 6 | 1024    | 16| 4096 | 0.3    | ~214M              | Table 3 "big" |
| small  | 3 | 256     | 4 | 1024 | 0.1    | CPU-sized          | this project |
| mini   | 4 | 128     | 4 | 256  | 0.3    | ~2.6M (vocab 10k)  | "Transformer-tiny" (Wu et al., 2021) |
| tiny   | 2 | 64      | 4 | 256  | 0.1    | for tests          | this project |

The paper's big model used P_drop = 0.3 for EN-DE (and 0.1 for EN-FR, §6.1).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

PRESETS = ("tiny", "mini", "small", "base", "big")


@dataclasses.dataclass
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer.

    Args:
        vocab_size: size of the (shared) subword vocabulary; id 0 is padding.
        num_layers: N, the number of encoder layers and of decoder layers (§3.1).
        d_model: width of every sublayer output and of the embeddings (§3.1).
        num_heads: h, parallel attention heads (§3.2.2).
        d_ff: inner width of the position-wise feed-forward network (§3.3).
        key_dim: d_k, per-head width of queries and keys. Default
            `d_model // num_heads` (§3.2.2).
        value_dim: d_v, per-head width of values. Default
            `d_model // num_heads` (§3.2.2), whatever `key_dim` is: Table 3
            row (B) changes d_k alone (Keras's `MultiHeadAttention` would
            default d_v to d_k instead).
        dropout: P_drop, residual dropout on every sublayer output and on the
            sums of embeddings and positional encodings (§5.4).
        attention_dropout: dropout on attention weights. The paper does not use
            it; default 0.0 (tensor2tensor's base also uses 0.0).
        label_smoothing: epsilon_ls (§5.4).
        norm_first: False (default) is the paper's post-LN,
            `LayerNorm(x + Sublayer(x))`; True is pre-LN,
            `x + Sublayer(LayerNorm(x))`, with a final LayerNorm on each stack.
        share_embeddings: share one matrix between source embedding, target
            embedding and pre-softmax projection (§3.4). Needs a joint vocabulary.
        positional_encoding: "sinusoidal" (default, §3.5) or "learned"
            (Table 3, row E).
        max_length: longest sequence (in tokens) the data pipeline produces and
            the learned position table covers; sinusoids work at any length.
        layer_norm_epsilon: epsilon of every LayerNorm.
        activation: activation of the feed-forward network; "relu" (§3.3).
        use_bias: whether the attention projections W^Q, W^K, W^V, W^O carry a
            bias. The paper defines them as matrices only, so default False.
    """

    vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    num_heads: int = 8
    d_ff: int = 2048
    key_dim: int | None = None
    value_dim: int | None = None
    dropout: float = 0.1
    attention_dropout: float = 0.0
    label_smoothing: float = 0.1
    norm_first: bool = False
    share_embeddings: bool = True
    positional_encoding: str = "sinusoidal"
    max_length: int = 256
    layer_norm_epsilon: float = 1e-6
    activation: str = "relu"
    use_bias: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "d_ff", "max_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}.")
        if self.vocab_size < 4:
            raise ValueError(
                f"TransformerConfig.vocab_size must be at least 4 (pad, unk, start, end), got {self.vocab_size}."
            )
        # d_k = d_v = d_model / h (§3.2.2), each unless given: Table 3 row (B) sets d_k alone.
        for name in ("key_dim", "value_dim"):
            if getattr(self, name) is not None:
                continue
            if self.d_model % self.num_heads:
                raise ValueError(
                    f"TransformerConfig: d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                    f"give {name} explicitly or change one of them."
                )
            setattr(self, name, self.d_model // self.num_heads)
        for name in ("key_dim", "value_dim"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"TransformerConfig.{name} must be a positive integer, got {value!r}.")
        for name in ("dropout", "attention_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise ValueError(f"TransformerConfig.{name} must be in [0, 1), got {value!r}.")
        if self.positional_encoding not in ("sinusoidal", "learned"):
            raise ValueError(
                "TransformerConfig.positional_encoding must be 'sinusoidal' or 'learned', "
                f"got {self.positional_encoding!r}."
            )
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"TransformerConfig.layer_norm_epsilon must be positive, got {self.layer_norm_epsilon!r}.")

    # Presets -----------------------------------------------------------------

    @classmethod
    def base(cls, vocab_size: int = 37000, **overrides: Any) -> TransformerConfig:
        """The paper's base model (Table 3): N=6, d_model=512, h=8, d_ff=2048, P_drop=0.1."""
        return cls(
            **{
                **dict(vocab_size=vocab_size, num_layers=6, d_model=512, num_heads=8, d_ff=2048, dropout=0.1),
                **overrides,
            }
        )

    @classmethod
    def big(cls, vocab_size: int = 37000, **overrides: Any) -> TransformerConfig:
        """The paper's big model (Table 3): N=6, d_model=1024, h=16, d_ff=4096, P_drop=0.3."""
        return cls(
            **{
                **dict(vocab_size=vocab_size, num_layers=6, d_model=1024, num_heads=16, d_ff=4096, dropout=0.3),
                **overrides,
            }
        )

    @classmethod
    def small(cls, vocab_size: int = 8000, **overrides: Any) -> TransformerConfig:
        """A CPU-sized model: N=3, d_model=256, h=4, d_ff=1024, P_drop=0.1."""
        return cls(
            **{
                **dict(vocab_size=vocab_size, num_layers=3, d_model=256, num_heads=4, d_ff=1024, dropout=0.1),
                **overrides,
            }
        )

    @classmethod
    def mini(cls, vocab_size: int = 8000, **overrides: Any) -> TransformerConfig:
        """The small Transformer of Multi30k papers: N=4, d_model=128, h=4, d_ff=256, P_drop=0.3.

        The "Transformer-tiny" of Wu et al. (2021, fairseq; 41.0 lower-cased
        tokenized BLEU on test2016 after 8,000 updates of ~8k tokens), a
        narrower, deeper model than `small` that sees more epochs per hour.
        """
        return cls(
            **{
                **dict(vocab_size=vocab_size, num_layers=4, d_model=128, num_heads=4, d_ff=256, dropout=0.3),
                **overrides,
            }
        )

    @classmethod
    def tiny(cls, vocab_size: int = 8000, **overrides: Any) -> TransformerConfig:
        """A model for tests and smoke runs: N=2, d_model=64, h=4, d_ff=256."""
        return cls(
            **{**dict(vocab_size=vocab_size, num_layers=2, d_model=64, num_heads=4, d_ff=256, dropout=0.1), **overrides}
        )

    @classmethod
    def from_preset(cls, name: str, vocab_size: int, **overrides: Any) -> TransformerConfig:
        """Builds the preset called `name` (one of `PRESETS`) with overrides."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}; expected one of {', '.join(PRESETS)}.")
        return getattr(cls, name)(vocab_size, **overrides)

    # Serialization -----------------------------------------------------------

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"Unknown TransformerConfig field(s): {', '.join(unknown)}.")
        return cls(**values)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TransformerConfig:
        return cls.from_dict(json.loads(text))
