"""`keras_transformer.compat`: each private Keras / TensorFlow / tensorflow-text API it wraps still works.

One test per function, on the installed versions: an upgrade that moves or
changes one of those private names fails here, by name. The last tests scan
the package's sources: no other module uses a private Keras / TensorFlow
name (a `keras.src` or `tensorflow.python` module, a `_pywrap` module, or a
private attribute such as `optimizer._momentums`).
"""

import ast
import importlib
import inspect
import pathlib
import re

import h5py
import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import compat


def test_graph_is_compiled_by_xla():
    seen = {}

    def probe(name):
        seen[name] = compat.graph_is_compiled_by_xla()
        return tf.constant(1.0)

    @tf.function
    def plain():
        return probe("plain")

    @tf.function(jit_compile=True)
    def xla():
        return probe("xla")

    @tf.function
    def inner():
        return probe("nested")

    @tf.function(jit_compile=True)
    def outer():
        return inner()  # a plain function called from an XLA cluster is compiled with it

    for function in (plain, xla, outer):
        assert float(function()) == 1.0
    assert seen == {"plain": False, "xla": True, "nested": True}
    assert compat.graph_is_compiled_by_xla() is False  # eager


def test_runs_with_xla_semantics():
    seen = {}

    def probe(name):
        seen[name] = compat.runs_with_xla_semantics()
        return tf.constant(1.0)

    tf.function(lambda: probe("plain"))()
    tf.function(lambda: probe("xla"), jit_compile=True)()
    probe("eager")
    assert seen == {"plain": False, "xla": True, "eager": False}


def test_onednn_kernels_enabled_follows_tf_enable_onednn_opts():
    import os
    import subprocess
    import sys

    probe = "from keras_transformer import compat; print(compat.onednn_kernels_enabled())"
    for setting, expected in (("0", "False"), ("1", "True")):
        environ = dict(os.environ, TF_ENABLE_ONEDNN_OPTS=setting, TF_CPP_MIN_LOG_LEVEL="3")
        output = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True, text=True, check=True)
        assert output.stdout.split()[-1] == expected
    assert isinstance(compat.onednn_kernels_enabled(), bool)


def test_gradient_may_be_recorded():
    seen = []

    @tf.function
    def probe():
        seen.append(compat.gradient_may_be_recorded())
        return tf.constant(1.0)

    assert compat.gradient_may_be_recorded() is False
    probe.get_concrete_function()  # traced without a tape
    with tf.GradientTape() as tape:
        assert compat.gradient_may_be_recorded() is True
        tf.function(probe.python_function).get_concrete_function()  # traced under it
        with tape.stop_recording():
            assert compat.gradient_may_be_recorded() is False
    assert seen == [False, True]


def tiny_model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def h5_datasets(path):
    names = []
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return names


def test_save_weights_without_optimizer(tmp_path):
    model = tiny_model()
    x, y = np.random.RandomState(0).normal(size=(8, 3)), np.zeros((8, 2))
    model.fit(x, y, epochs=1, verbose=0)  # the optimizer has its moments now
    assert len(model.optimizer.variables) > 2

    ours, keras_own = tmp_path / "ours.weights.h5", tmp_path / "all.weights.h5"
    compat.save_weights_without_optimizer(model, ours)
    model.save_weights(keras_own)
    ours_names, all_names = h5_datasets(ours), h5_datasets(keras_own)
    assert not any(name.startswith("optimizer") for name in ours_names), ours_names
    assert any(name.startswith("optimizer") for name in all_names), all_names  # what it leaves out
    assert set(ours_names) < set(all_names) and len(ours_names) == len(model.weights) == 4
    assert ours.stat().st_size < keras_own.stat().st_size

    fresh = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    fresh.load_weights(ours)
    for loaded, saved in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(loaded, saved)


def test_learning_rate_schedule():
    from keras_transformer.optimization import TransformerSchedule, create_optimizer

    schedule = TransformerSchedule(d_model=64, warmup_steps=10)
    assert compat.learning_rate_schedule(keras.optimizers.Adam(learning_rate=schedule)) is schedule
    optimizer = create_optimizer(d_model=64, warmup_steps=10)
    found = compat.learning_rate_schedule(optimizer)
    assert isinstance(found, TransformerSchedule) and found.warmup_steps == 10
    # A constant rate: the variable, not a schedule.
    constant = compat.learning_rate_schedule(keras.optimizers.Adam(learning_rate=0.25))
    assert not isinstance(constant, keras.optimizers.schedules.LearningRateSchedule)
    assert float(np.asarray(constant)) == 0.25


def test_build_model_from_spec():
    model = keras.Sequential([keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    x, y = np.ones((6, 3), "float32"), np.zeros((6, 2), "float32")
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(3)
    assert not model.built and not model.optimizer.built and not model._compile_loss.built

    compat.build_model_from_spec(model, dataset.element_spec)
    assert model.built and [tuple(w.shape) for w in model.weights] == [(3, 4), (4,), (4, 2), (2,)]
    assert model.optimizer.built and model._compile_loss.built and model._compile_metrics.built

    # Keras no longer builds from a batch: its build hook is a no-op, called as Keras calls it.
    def fail(*args, **kwargs):
        raise AssertionError("Keras built the model again")

    model._symbolic_build = fail
    assert model._maybe_symbolic_build(iterator=None) is None
    assert model._maybe_symbolic_build(data_batch=(x, y, None)) is None
    # And fit/evaluate still run (under a strategy, where Keras would call the hook).
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        model_under_strategy = keras.Sequential([keras.layers.Dense(2)])
        model_under_strategy.compile(optimizer="adam", loss="mse")
        compat.build_model_from_spec(model_under_strategy, dataset.element_spec)
    assert model_under_strategy._distribute_strategy is not None  # so Keras calls the hook in fit
    model_under_strategy._symbolic_build = fail
    history = model_under_strategy.fit(dataset, epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][0])
    assert np.isfinite(model_under_strategy.evaluate(dataset, verbose=0))


@pytest.fixture(scope="module")
def spm_proto(tmp_path_factory):
    """A 400-piece SentencePiece model of 300 Multi30k sentence pairs (a fraction of a second)."""
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.data.tokenizer import train_tokenizer

    prefix = tmp_path_factory.mktemp("spm") / "spm"
    texts = read_lines("train", "en")[:300] + read_lines("train", "de")[:300]
    return train_tokenizer(texts, prefix, vocab_size=400).model_proto


def test_shared_sentencepiece_resource_survives_set_random_seed(spm_proto):
    import tensorflow_text as tf_text

    from keras_transformer.data.tokenizer import Tokenizer

    sentences = ["A dog runs in the park.", "Zwei Männer unterhalten sich."]
    tokenizer = Tokenizer(spm_proto)
    direct = tf_text.SentencepieceTokenizer(model=spm_proto, out_type=tf.int32)
    resource = compat.shared_sentencepiece_resource(spm_proto, "keras_transformer_test_compat")
    compat.attach_sentencepiece_resource(direct, resource)
    expected = tokenizer.tokenize(sentences).to_list()
    assert direct.tokenize(sentences).to_list() == expected and all(expected)

    # Both clear the eager kernel cache, which deletes a resource without a shared name (tensorflow/text#570).
    keras.utils.set_random_seed(5)
    tf.random.set_seed(6)
    assert tokenizer.tokenize(sentences).to_list() == expected
    assert direct.tokenize(sentences).to_list() == expected
    assert [t.decode() for t in direct.detokenize(tf.ragged.constant(expected)).numpy()] == sentences

    @tf.function
    def in_graph(strings):
        return direct.tokenize(strings).to_tensor()

    assert in_graph(tf.constant(sentences)).numpy()[0, : len(expected[0])].tolist() == expected[0]


def test_serialized_saved_model(tmp_path):
    class Square(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def __call__(self, x):
            return tf.math.square(x) + 1.0

    export_dir = str(tmp_path / "square")
    tf.saved_model.save(Square(), export_dir)
    proto = compat.serialized_saved_model(export_dir)
    assert proto.meta_graphs
    ops = set()
    for meta_graph in proto.meta_graphs:
        ops.update(node.op for node in meta_graph.graph_def.node)
        for function in meta_graph.graph_def.library.function:
            ops.update(node.op for node in function.node_def)
    assert {"Square", "AddV2"} <= ops
    assert "serving_default" in proto.meta_graphs[0].signature_def


def test_adam_moments():
    """After one step from zero moments, m = (1 - beta_1) g and v = (1 - beta_2) g^2, for each variable."""
    variables = [keras.Variable(np.ones((3, 2), "float32")), keras.Variable(np.zeros(4, "float32"))]
    gradients = [np.full((3, 2), 2.0, "float32"), np.arange(4, dtype="float32")]
    optimizer = keras.optimizers.Adam(learning_rate=0.1, beta_1=0.9, beta_2=0.98)
    optimizer.apply(gradients, variables)
    for variable, gradient in zip(variables, gradients):
        m, v = compat.adam_moments(optimizer, variable)
        assert tuple(m.shape) == tuple(v.shape) == tuple(variable.shape)
        np.testing.assert_allclose(m.numpy(), 0.1 * gradient, rtol=1e-6)
        np.testing.assert_allclose(v.numpy(), 0.02 * gradient**2, rtol=1e-5)


def test_set_tensorboard_batch_count(tmp_path):
    """Batch-level summaries are written at the count set before each batch, plus 1."""

    class Offset(keras.callbacks.TensorBoard):
        def on_train_begin(self, logs=None):
            super().on_train_begin(logs)
            compat.set_tensorboard_batch_count(self, 100)

        def on_train_batch_begin(self, batch, logs=None):
            compat.set_tensorboard_batch_count(self, 100 + 10 * batch)
            super().on_train_batch_begin(batch, logs)

    model = tiny_model()
    x, y = np.ones((6, 3), "float32"), np.zeros((6, 2), "float32")
    model.fit(x, y, batch_size=2, epochs=1, verbose=0, callbacks=[Offset(tmp_path, update_freq=1, write_graph=False)])
    steps = []
    for path in (tmp_path / "train").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            steps += [event.step for value in event.summary.value if value.tag == "batch_loss"]
    assert sorted(steps) == [101, 111, 121]


def test_swap_ema_weights():
    """The weights become the optimizer's moving averages; a second swap restores them bit for bit."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(1e-2, use_ema=True, ema_momentum=0.5), loss="mse")
    rng = np.random.RandomState(1)
    for _ in range(3):  # not `fit`, which ends by overwriting the weights with the averages
        gradients = [rng.normal(size=v.shape).astype("float32") for v in model.trainable_variables]
        model.optimizer.apply(gradients, model.trainable_variables)
    training = [v.numpy() for v in model.trainable_variables]
    averages = [v.numpy() for v in model.optimizer._model_variables_moving_average]
    assert any(np.abs(t - a).max() > 1e-4 for t, a in zip(training, averages))

    compat.swap_ema_weights(model)
    for variable, average in zip(model.trainable_variables, averages):
        np.testing.assert_array_equal(variable.numpy(), average)
    compat.swap_ema_weights(model)
    for variable, value in zip(model.trainable_variables, training):
        np.testing.assert_array_equal(variable.numpy(), value)


def test_frozen_function():
    variable = tf.Variable([1.0, 2.0])
    function = tf.function(lambda x: {"y": x * variable}, input_signature=[tf.TensorSpec([None], tf.float32)])
    frozen = compat.frozen_function(function.get_concrete_function())
    assert not frozen.captured_inputs
    assert "ReadVariableOp" not in {op.type for op in frozen.graph.get_operations()}
    np.testing.assert_allclose(frozen(tf.constant([3.0, 4.0]))[0].numpy(), [3.0, 8.0])


def test_tflite_operator_names_and_interpreter_with_text_ops(tmp_path):
    """A LiteRT file with a builtin and a tensorflow-text op: its op names, and an interpreter that runs it."""
    import tensorflow_text as tf_text

    module = tf.Module()
    module.split = tf.function(
        lambda inputs: {"bytes": tf.cast(tf_text.ByteSplitter().split(inputs).flat_values, tf.int32) + 1},
        input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
    )
    converter = tf.lite.TFLiteConverter.from_concrete_functions([module.split.get_concrete_function()], module)
    converter.allow_custom_ops = True
    flatbuffer = converter.convert()
    names = compat.tflite_operator_names(flatbuffer)
    assert "CUSTOM:TFText>ByteSplitWithOffsets" in names and "ADD" in names
    path = tmp_path / "split.tflite"
    path.write_bytes(flatbuffer)
    reference = tf.lite.experimental.OpResolverType.BUILTIN_REF
    interpreter = compat.tflite_interpreter_with_custom_ops(str(path), compat.tflite_text_op_registerers(), reference)
    out = interpreter.get_signature_runner()(inputs=np.array([b"ab", b"c"], dtype=object))
    assert out["bytes"].tolist() == [98, 99, 100]


def test_tflite_text_op_registerers_without_importing_tensorflow_text():
    """Loaded from tensorflow-text's extension module alone: its package (which imports Keras) stays out."""
    import subprocess
    import sys

    probe = (
        "import sys; from keras_transformer import compat; registerers = compat.tflite_text_op_registerers(); "
        "print(len(registerers), 'tensorflow_text' in sys.modules, compat.tflite_text_op_registerers() == registerers)"
    )
    environ = dict(__import__("os").environ, TF_CPP_MIN_LOG_LEVEL="3")
    output = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True, text=True, check=True)
    count, imported, same = output.stdout.split()[-3:]
    assert int(count) >= 2 and imported == "False" and same == "True"


# ---- No private Keras / TensorFlow name outside compat.py ----

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "keras_transformer"
PRIVATE_MODULES = (  # and any `_pywrap` module
    "keras.src",
    "tensorflow.python",
    "tensorflow.core",
    "tensorflow.__internal__",
    "tf.python",  # as `import tensorflow as tf` names them
    "tf.core",
    "tf.__internal__",
    "tensorflow_text.python",
    "tf_keras.src",
)
FOREIGN_PACKAGES = ("keras", "tensorflow", "tensorflow_text", "tf_keras")
# Private uses left in other modules, as (path relative to the package, what the scan reports), each with
# the reason it is not in compat.py yet. None.
KNOWN_EXCEPTIONS = set()


def is_private(name):
    return name.startswith("_") and not name.startswith("__")


def names_private_to(package_objects):
    """Private names (`_x`) that the Keras / TensorFlow classes among `package_objects`' MROs define or use."""
    names = set()
    for base in package_objects:
        for cls in inspect.getmro(base):
            if cls.__module__.split(".")[0] not in FOREIGN_PACKAGES:
                continue
            names.update(name for name in vars(cls) if is_private(name))
            try:
                source = inspect.getsource(cls)
            except (OSError, TypeError):
                continue
            names.update(re.findall(r"\bself\.(_[a-z]\w*)", source))
    return names


def dotted(node):
    """`a.b.c` of a Name / Attribute chain, or None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def base_classes(class_node, namespace):
    import tensorflow as tf

    found = []
    for base in class_node.bases:
        try:
            value = eval(compile(ast.Expression(base), "<base>", "eval"), {"keras": keras, "tf": tf, **namespace})
        except Exception:  # a base the module imports inside a function: not ours to resolve
            continue
        if isinstance(value, type):
            found.append(value)
    return found


def own_private_names(trees):
    """Private names the package itself defines: functions, classes, module globals, `self._x =`, class attributes."""
    names = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and is_private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and is_private(node.id):
                names.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and is_private(node.attr)
            ):
                names.add(node.attr)
    return names


def private_uses(sources, namespaces):
    """`(file, line, what)` of every private Keras / TensorFlow name used in `sources` ({file: source text}).

    Flags imports of and attribute chains into private modules (`keras.src`,
    `tensorflow.python`, ...) and `_pywrap` modules; `self._x` in a subclass
    of a Keras / TensorFlow class when that class has or uses `_x`; and
    `obj._x` (or `getattr(obj, "_x")`) on any other object when the package
    defines no `_x` of its own. `namespaces` ({file: module globals}) resolve
    the base classes.
    """
    trees = {path: ast.parse(source) for path, source in sources.items()}
    own = own_private_names(trees.values())
    found = []
    for path, tree in trees.items():
        namespace = namespaces.get(path, {})
        foreign_private = {}  # class node -> private names of its Keras / TF bases

        def flag(node, what, path=path):
            found.append((path, node.lineno, what))

        for class_node in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
            names = names_private_to(base_classes(class_node, namespace))
            for node in ast.walk(class_node):
                foreign_private.setdefault(node, names)
        for node in ast.walk(tree):
            modules = []
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                modules = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Attribute) and dotted(node):
                modules = [dotted(node)]
            for module in modules:
                if module.startswith(PRIVATE_MODULES) or "_pywrap" in module:
                    flag(node, module)
                    break
            attribute, value = None, None
            if isinstance(node, ast.Attribute) and is_private(node.attr):
                attribute, value = node.attr, node.value
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("getattr", "setattr", "hasattr")
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
                and is_private(node.args[1].value)
            ):
                attribute, value = node.args[1].value, node.args[0]
            if attribute is None:
                continue
            is_self = (isinstance(value, ast.Name) and value.id in ("self", "cls")) or (
                isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"
            )
            if is_self:
                if attribute in foreign_private.get(node, set()):
                    flag(node, f"self.{attribute} (a private name of a Keras / TensorFlow base class)")
            elif attribute not in own:
                flag(node, f"{ast.unparse(value)}.{attribute}")
    return found


def package_sources():
    sources, namespaces = {}, {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "compat.py":
            continue
        sources[relative] = path.read_text()
        module = "keras_transformer." + relative[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        namespaces[relative] = vars(importlib.import_module(module))
    return sources, namespaces


def test_no_private_keras_or_tensorflow_name_outside_compat():
    """Every private Keras / TensorFlow / tensorflow-text name the package uses goes through `compat`."""
    found = private_uses(*package_sources())
    unexpected = [use for use in found if (use[0], use[2]) not in KNOWN_EXCEPTIONS]
    assert not unexpected, "private names outside compat.py:\n" + "\n".join(f"{p}:{n}: {w}" for p, n, w in unexpected)
    stale = KNOWN_EXCEPTIONS - {(path, what) for path, _, what in found}
    assert not stale, f"known exceptions no longer found, remove them: {stale}"


PRIVATE_USES = [  # (source, the name the scan must report)
    ("from keras.src.saving import saving_lib", "keras.src.saving"),
    ("import tensorflow.python.eager.record", "tensorflow.python.eager.record"),
    ("from tensorflow.python.util import _pywrap_util_port", "tensorflow.python.util"),
    ("import tensorflow as tf\nx = tf.python.ops", "tf.python.ops"),
    ("def f(optimizer):\n    return optimizer._momentums[0]", "optimizer._momentums"),
    ("def f(model):\n    return getattr(model, '_symbolic_build')", "model._symbolic_build"),
    ("def f(tokenizer, r):\n    tokenizer._model_resource = r", "tokenizer._model_resource"),
    (
        "class T(keras.callbacks.TensorBoard):\n    def g(self):\n        self._global_train_batch = 3",
        "self._global_train_batch",
    ),
    (
        "class A(keras.optimizers.Adam):\n    def g(self, v):\n        return self._get_variable_index(v)",
        "self._get_variable_index",
    ),
]
OWN_NAMES = [
    "class T(keras.callbacks.Callback):\n    def g(self):\n        self._own_counter = 3",  # not a Keras name
    "class M:\n    def __init__(self):\n        self._jit = 1\n\ndef f(m):\n    return m._jit",  # the package's own
    "def _helper():\n    pass\n\nclass C:\n    _other = 1\n\n    def g(self):\n        return _helper() or C._other",
    "import tensorflow as tf\nx = tf.raw_ops.ResourceApplyAdam",  # public
    "def f():\n    return 'keras.src is named here only in a string'",
]


@pytest.mark.parametrize("source, name", PRIVATE_USES, ids=[name for _, name in PRIVATE_USES])
def test_the_scan_finds_private_names(source, name):
    import tensorflow as tf

    found = private_uses({"module.py": source}, {"module.py": {"keras": keras, "tf": tf}})
    assert [what.split(" ")[0] for _, _, what in found][:1] == [name], found


@pytest.mark.parametrize("source", OWN_NAMES)
def test_the_scan_leaves_own_and_public_names(source):
    import tensorflow as tf

    assert private_uses({"module.py": source}, {"module.py": {"keras": keras, "tf": tf}}) == []
