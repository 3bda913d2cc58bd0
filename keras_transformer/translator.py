"""Deprecated: `keras_transformer.translator` is now `keras_transformer.inference.translator` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.translator moved to keras_transformer.inference.translator; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.inference.translator import *  # noqa: E402,F401,F403
