"""Deprecated: `keras_transformer.export_ctranslate2` is now `keras_transformer.inference.ctranslate2` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.export_ctranslate2 moved to keras_transformer.inference.ctranslate2; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.inference.ctranslate2 import *  # noqa: E402,F401,F403
