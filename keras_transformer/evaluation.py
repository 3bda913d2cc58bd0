"""Deprecated: `keras_transformer.evaluation` is now `keras_transformer.inference.evaluation` (this path works for one release)."""

import warnings

warnings.warn(
    "keras_transformer.evaluation moved to keras_transformer.inference.evaluation; the old path will be removed in the next release.",
    DeprecationWarning,
    stacklevel=2,
)

from keras_transformer.inference.evaluation import *  # noqa: E402,F401,F403
