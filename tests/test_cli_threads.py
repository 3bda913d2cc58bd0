"""The thread pools `translate` and `evaluate` give TensorFlow: each batch in flight its share of the cores."""

import os
import subprocess
import sys

import pytest

from keras_transformer.cli import threads
from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_WORKERS


def test_each_batch_in_flight_gets_its_share_of_the_cores():
    assert threads.pools_for(2, cores=2) == (1, 2)
    assert threads.pools_for(2, cores=8) == (4, 2)
    assert threads.pools_for(2, cores=3) == (1, 2)
    assert threads.pools_for(1, cores=4) == (4, 1)
    assert threads.pools_for(2, cores=1) == (1, 2)  # never zero threads
    for workers in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="workers must be a positive integer"):
            threads.pools_for(workers, cores=2)


def _recorded_pool_settings(monkeypatch):
    """TensorFlow's two pool setters replaced by a record of their calls (whether or not its runtime has started)."""
    import tensorflow as tf

    calls = []
    monkeypatch.setattr(tf.config.threading, "set_intra_op_parallelism_threads", lambda n: calls.append(("intra", n)))
    monkeypatch.setattr(tf.config.threading, "set_inter_op_parallelism_threads", lambda n: calls.append(("inter", n)))
    return calls


def test_pools_set_by_the_environment_are_kept(monkeypatch):
    calls = _recorded_pool_settings(monkeypatch)
    for name in threads.THREAD_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    for name in threads.THREAD_ENVIRONMENT:
        monkeypatch.setenv(name, "3")
        assert threads.set_pools_for(2) is None
        monkeypatch.delenv(name)
    assert calls == []
    # Without them, the same call sets both pools.
    intra, inter = threads.pools_for(2)
    assert threads.set_pools_for(2) == (intra, inter)
    assert calls == [("intra", intra), ("inter", inter)]


def test_pools_of_a_running_tensorflow_are_left_as_they_are(monkeypatch):
    import tensorflow as tf

    for name in threads.THREAD_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    tf.constant(1.0) + 1.0  # the runtime has started
    before = tf.config.threading.get_intra_op_parallelism_threads()
    assert threads.set_pools_for(2) is None
    assert tf.config.threading.get_intra_op_parallelism_threads() == before


def _pools_after_command(argv, environ):
    """The pools TensorFlow has after `keras-transformer ARGV` ran in a fresh process (a failed load is fine)."""
    script = (
        "import sys, tensorflow as tf\n"
        "from keras_transformer.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(),"
        " tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_ENVIRONMENT}
    env.update(environ, TF_CPP_MIN_LOG_LEVEL="2")
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=True
    )
    return tuple(int(x) for x in out.stdout.split()[-2:])


@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_translating_commands_set_the_pools_before_tensorflow_starts(tmp_path, command):
    argv = [command, "--model", str(tmp_path / "no_model")]
    argv += ["A dog."] if command == "translate" else ["--multi30k", "val"]
    assert _pools_after_command(argv, {}) == threads.pools_for(DEFAULT_TRANSLATE_WORKERS)
    # TensorFlow reads these variables itself; the command leaves its configuration alone.
    assert _pools_after_command(argv, {"TF_NUM_INTRAOP_THREADS": "3"}) == (0, 0)
