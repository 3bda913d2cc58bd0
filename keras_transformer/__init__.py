"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in Keras 3.

The model follows the paper:

- `config`: `TransformerConfig` and its presets (Table 3).
- `layers`: attention (§3.2), feed-forward (§3.3), embeddings (§3.4),
  positional encoding (§3.5), encoder and decoder (§3.1).
- `model`: the encoder-decoder `Transformer` (Figure 1).
- `losses`: label smoothing (§5.4) and token accuracy.
- `optimization`: Adam and the learning-rate schedule (§5.3).
- `decoding`: greedy, beam (§6.1) and sampling search.
- `kernels`: the CPU and compiler forms of some of the paper's computations,
  each equal to the plain form its layer shows.
- `special_ids`, `compat` (every private Keras or TensorFlow API in one
  place), `hardware` (the CPU and GPUs, and the precision they favour).

The pipeline beside it, which the model never imports:

- `data`: text files, shipped corpora, TFDS, the tokenizer, batching (§5.1).
- `training`: the fit loop, distribution, checkpoints and averaging (§5.2, §6.1).
- `run_dir`: the run directory that training writes and inference reads.
- `inference`: translation, scores, SavedModel and CTranslate2 exports.
- `cli`: the `keras-transformer` command.
- `errors`: `ParameterError`, a bad argument named by its parameter.

Importing the package loads the model (and registers its layers with
Keras's serialization), not the pipeline.
"""

from keras_transformer import layers
from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
from keras_transformer.model import Transformer
from keras_transformer.optimization import FusedAdam, TransformerSchedule, create_optimizer

__version__ = "0.3.0"

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
