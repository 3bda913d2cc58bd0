"""`keras_transformer.onednn`: TensorFlow's oneDNN rewrites on, unless the user decided otherwise."""

import os
import subprocess
import sys

from keras_transformer.onednn import VARIABLE, enable_onednn_opts

PROBE = ("import os, sys\n"
         "{first}\n"
         "import keras_transformer\n"
         "from keras_transformer import compat\n"
         "print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'), compat.onednn_enabled())\n")


def _probe(first="", **environ):
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env.update(environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, "-c", PROBE.format(first=first)], env=env, capture_output=True,
                            text=True, timeout=300, check=True)
    return result.stdout.split()[-2:]


def test_sets_the_variable_only_when_unset_and_before_tensorflow():
    environ = {}
    assert enable_onednn_opts(environ, modules={}) and environ == {VARIABLE: "1"}
    environ = {VARIABLE: "0"}
    assert not enable_onednn_opts(environ, modules={}) and environ == {VARIABLE: "0"}
    environ = {}
    assert not enable_onednn_opts(environ, modules={"tensorflow": object()}) and environ == {}


def test_importing_the_package_first_turns_onednn_on_and_respects_the_users_choice():
    assert _probe() == ["1", "True"]  # on every CPU, AVX2-only ones included
    assert _probe(**{VARIABLE: "0"}) == ["0", "False"]
    # TensorFlow imported first: its own default stands (on, on CPUs with AVX512_VNNI/BF16 or AMX).
    assert _probe(first="import tensorflow")[0] == "None"
