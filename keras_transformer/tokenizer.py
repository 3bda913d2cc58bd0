"""Deprecated: `keras_transformer.tokenizer` is now `keras_transformer.data.tokenizer` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.tokenizer moved to keras_transformer.data.tokenizer; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.data.tokenizer import *  # noqa: E402,F401,F403
