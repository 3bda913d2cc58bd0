"""keras-transformer: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) in Keras 3.

The model follows the paper:

- `config`: `TransformerConfig` and its presets (Table 3).
- `layers`: attention (§3.2), feed-forward (§3.3), embeddings (§3.4),
  positional encoding (§3.5), encoder and decoder (§3.1).
- `model`: the encoder-decoder `Transformer` (Figure 1).
- `losses`: label smoothing (§5.4) and token accuracy.
- `optimization`: Adam and the learning-rate schedule (§5.3).
- `decoding`: greedy, beam (§6.1) and sampling search.
- `ensemble`: `Ensemble`, models of one vocabulary decoded as one (not in the paper).
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

Importing the package is cheap: it loads neither Keras nor TensorFlow, so
that `keras-transformer --version` answers at once and the command line can
quiet TensorFlow's start-up before it loads. The model's names
(`keras_transformer.Transformer`, ...) load on first use, and the classes
Keras deserializes (the layers, the model, the loss, the optimizer) register
themselves with Keras's serialization as soon as Keras is imported, so a
`.keras` file of a `Transformer` loads after a plain `import keras_transformer`
whichever of the two was imported first (a program that first imports
`keras_transformer.layers` alone registers the `Transformer` class when it
imports `keras_transformer.model`).
"""

import importlib
import importlib.abc
import importlib.util
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what the names below resolve to, for readers and type checkers
    from keras_transformer import layers
    from keras_transformer.config import PRESETS, TransformerConfig
    from keras_transformer.ensemble import Ensemble
    from keras_transformer.losses import LabelSmoothedCrossEntropy, MaskedAccuracy
    from keras_transformer.model import Transformer
    from keras_transformer.optimization import FusedAdam, TransformerSchedule, create_optimizer

__version__ = "0.3.0"

# Each public name, and the module that defines it (loaded on first use).
_LAZY_NAMES = {
    "Ensemble": "keras_transformer.ensemble",
    "PRESETS": "keras_transformer.config",
    "TransformerConfig": "keras_transformer.config",
    "FusedAdam": "keras_transformer.optimization",
    "LabelSmoothedCrossEntropy": "keras_transformer.losses",
    "MaskedAccuracy": "keras_transformer.losses",
    "Transformer": "keras_transformer.model",
    "TransformerSchedule": "keras_transformer.optimization",
    "create_optimizer": "keras_transformer.optimization",
}
# The modules whose classes register with Keras's serialization (`.keras` files name them).
SERIALIZABLE_MODULES = (
    "keras_transformer.layers",
    "keras_transformer.model",
    "keras_transformer.losses",
    "keras_transformer.optimization",
)

__all__ = [
    "Ensemble",
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


def __getattr__(name):
    if name in _LAZY_NAMES or name == "layers":
        importlib.import_module("keras")  # first, so that every serializable class registers (see below)
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    elif name == "layers":
        value = importlib.import_module("keras_transformer.layers")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted([*globals(), *_LAZY_NAMES, "layers"])


def register_serializables():
    """Imports the modules whose classes Keras deserializes, which registers them (idempotent).

    When Keras is first imported by one of these modules, the ones that
    need that module finished cannot be imported yet: they are left to
    the import under way (which registers what it loads).
    """
    for module in SERIALIZABLE_MODULES:
        try:
            importlib.import_module(module)
        except ImportError:
            if not _initializing():
                raise


def _initializing():
    """True while a module of the package is being imported (Keras is then loaded from inside it)."""
    return any(
        getattr(getattr(module, "__spec__", None), "_initializing", False)
        for name, module in list(sys.modules.items())
        if name.startswith(__name__ + ".")
    )


class _RegisterWhenKerasLoads(importlib.abc.MetaPathFinder):
    """Runs `register_serializables` once the `keras` module has been executed (then leaves `sys.meta_path`).

    A `find_spec("keras")` that does not go on to load it (TensorFlow asks
    whether Keras is installed) leaves the finder in place.
    """

    def __init__(self):
        self._finding = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "keras" or self._finding:
            return None
        self._finding = True
        try:
            spec = importlib.util.find_spec("keras")
        finally:
            self._finding = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module
        finder = self

        def exec_then_register(module):
            exec_module(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            sys.modules[fullname] = module  # what `import keras` will return, before our modules import it
            register_serializables()

        spec.loader.exec_module = exec_then_register
        return spec


if "keras" in sys.modules:
    register_serializables()
else:
    sys.meta_path.insert(0, _RegisterWhenKerasLoads())
