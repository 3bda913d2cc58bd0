"""Deprecated: `keras_transformer.attention_maps` is now `keras_transformer.inference.attention_maps` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.attention_maps moved to keras_transformer.inference.attention_maps; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.inference.attention_maps import *  # noqa: E402,F401,F403
