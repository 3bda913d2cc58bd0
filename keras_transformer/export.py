"""Deprecated: `keras_transformer.export` is now `keras_transformer.inference.saved_model` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.export moved to keras_transformer.inference.saved_model; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.inference.saved_model import *  # noqa: E402,F401,F403
