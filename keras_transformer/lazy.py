"""Public names of a package loaded on first use (PEP 562's module `__getattr__`).

The packages whose light modules the command line reads before it loads
TensorFlow (`decoding.defaults`, `inference.precision`, `training.options`)
list their public names and the module that defines each; a name's module is
imported the first time the name is read, so `keras-transformer COMMAND
--help` answers without TensorFlow.
"""

import importlib
import sys


def lazy_exports(package, exports):
    """`(__getattr__, __dir__)` for the package `package` (its `__name__`) that serve `exports` lazily.

    Args:
        package: the package's `__name__`.
        exports: `{public name: the module that defines it}`.

    Returns:
        the two module-level functions, to assign in the package's `__init__`.

    Example:
        `__getattr__, __dir__ = lazy_exports(__name__, {"beam_search": "keras_transformer.decoding.search"})`
    """

    def __getattr__(name):
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__():
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__
