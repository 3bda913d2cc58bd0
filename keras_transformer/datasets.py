"""Deprecated: `keras_transformer.datasets` is now `keras_transformer.data.corpora` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.datasets moved to keras_transformer.data.corpora; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.data.corpora import *  # noqa: E402,F401,F403
