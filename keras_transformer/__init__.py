"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in Keras 3.

Modules follow the paper:
- `layers`: attention (§3.2), feed-forward (§3.3), embeddings (§3.4),
  positional encoding (§3.5), encoder and decoder (§3.1)
- `model`: the encoder-decoder `Transformer` (Figure 1)
- `optimization`: Adam and the learning-rate schedule (§5.3)
- `losses`: label smoothing (§5.4) and token accuracy
- `decoding`: greedy and beam search (§6.1)

and the pipeline beside them: `datasets`, `data`, `tokenizer`, `training`,
`export`, `cli`.
"""

from keras_transformer import layers
from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import FusedAdam, TransformerSchedule, create_optimizer

__version__ = "0.2.0"

__all__ = [
    "PRESETS",
    "FusedAdam",
    "LabelSmoothedCrossEntropy",
    "MaskedAccuracy",
    "Transformer",
    "TransformerConfig",
    "TransformerSchedule",
    "create_optimizer",
    "layers",
]
