"""Every use of a private Keras, TensorFlow or tensorflow-text API, in one place.

Each function wraps one private name that has no public equivalent and says
why it is needed. `tests/test_compat.py` calls each of them, so an upgrade
that moves one fails there, by name, instead of somewhere deep in training
or serving; it also checks that no other module of the package uses a
private name. Imports are made inside the functions: importing this module
loads nothing.

- TensorFlow graphs: `graph_is_compiled_by_xla`, `runs_with_xla_semantics`,
  `onednn_kernels_enabled`, `gradient_may_be_recorded`.
- Keras training: `save_weights_without_optimizer`, `learning_rate_schedule`,
  `adam_moments`, `set_tensorboard_batch_count`, `build_model_from_spec`,
  `swap_ema_weights`.
- tensorflow-text and SavedModels: `shared_sentencepiece_resource`,
  `attach_sentencepiece_resource`, `serialized_saved_model`.
- LiteRT: `frozen_function`, `tflite_interpreter_with_custom_ops`,
  `tflite_operator_names`, `tflite_text_op_registerers`.
"""


def graph_is_compiled_by_xla():
    """Whether the TF graph being built is (or is nested in) an XLA cluster (`jit_compile=True`).

    TensorFlow has no public predicate for it; the attention layers write
    their decoding cache in place only under XLA (`MultiHeadAttention`).
    Wraps `tensorflow.python.ops.control_flow_util.GraphOrParentsInXlaContext`.

    Returns:
        bool; False when executing eagerly.
    """
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def runs_with_xla_semantics():
    """Whether Keras ops built here are compiled by XLA, or run on a backend other than TensorFlow.

    There a cache is updated in place (a dynamic-update-slice), and an
    out-of-range gather or update clamps instead of raising; eager
    TensorFlow and plain TensorFlow graphs raise. The layers that depend
    on it (`MultiHeadAttention`, `LearnedPositionalEmbedding`) ask here.

    Returns:
        bool.
    """
    import keras

    if keras.backend.backend() != "tensorflow":
        return True
    import tensorflow as tf

    return not tf.executing_eagerly() and graph_is_compiled_by_xla()


def onednn_kernels_enabled():
    """Whether this TensorFlow runs oneDNN's kernels (`TF_ENABLE_ONEDNN_OPTS`, or its default for the CPU).

    TensorFlow has no public predicate for it. `LayerNormalization` writes
    its inference form as the graph that TensorFlow's oneDNN rewrite fuses
    into one layer-norm kernel only where that rewrite runs: elsewhere the
    same graph runs an unfused batch norm, slower than its plain form.
    Wraps `tensorflow.python.util._pywrap_util_port.IsMklEnabled`.

    Returns:
        bool.
    """
    from tensorflow.python.util import _pywrap_util_port

    return bool(_pywrap_util_port.IsMklEnabled())


def gradient_may_be_recorded():
    """Whether a gradient tape records the ops being built here (eagerly, or while a function is traced).

    TensorFlow has no public predicate for it. `LabelSmoothedCrossEntropy`
    computes its gradient in the forward pass only when one may be asked
    for: not in `model.evaluate`, whose step is traced without a tape.
    Wraps `tensorflow.python.eager.record.could_possibly_record`.

    Returns:
        bool.
    """
    from tensorflow.python.eager import record

    return bool(record.could_possibly_record())


def save_weights_without_optimizer(model, path):
    """Writes only the model's weights (not its optimizer's) to a `.weights.h5` file.

    `model.save_weights` also writes the optimizer's variables (twice the
    size of a checkpoint); Keras' private
    `keras.src.saving.saving_lib.save_weights_only` can skip them.

    Args:
        model: a `keras.Model`, compiled or not.
        path: the `.weights.h5` file to write.
    """
    from keras.src.saving import saving_lib

    optimizer = getattr(model, "optimizer", None)  # none before compile()
    saving_lib.save_weights_only(model, path, objects_to_skip=[optimizer] if optimizer else None)


def learning_rate_schedule(optimizer):
    """The optimizer's learning rate as given: a schedule object, or a variable.

    `optimizer.learning_rate` evaluates a schedule at the current step; the
    monitor needs the schedule itself, to give the rate of the update just
    applied. Keras keeps it in the private `_learning_rate`.

    Args:
        optimizer: a `keras.optimizers.Optimizer`.

    Returns:
        A `keras.optimizers.schedules.LearningRateSchedule`, or the
        variable that holds a constant rate.
    """
    return optimizer._learning_rate


def adam_moments(optimizer, variable):
    """The first and second moment variables (m, v) that a `keras.optimizers.Adam` keeps for `variable`.

    Keras' Adam keeps them in its private lists `_momentums` and
    `_velocities`, indexed by its private `_get_variable_index`, and has no
    public accessor. `kernels.adam.fused_update` updates them in place.

    Args:
        optimizer: a built `keras.optimizers.Adam` (or subclass).
        variable: one of the variables it was built for.

    Returns:
        The two `keras.Variable`s `(m, v)`, the shape of `variable`.
    """
    index = optimizer._get_variable_index(variable)
    return optimizer._momentums[index], optimizer._velocities[index]


def set_tensorboard_batch_count(callback, count):
    """Sets how many training batches a `keras.callbacks.TensorBoard` callback counts as done.

    The callback writes its batch-level summaries at that count, which it
    keeps in its private `_global_train_batch`: it restarts it at 0 in every
    `fit` and adds 1 per execution of `steps_per_execution` steps, and has
    no public way to set it. `training.callbacks.GlobalStepTensorBoard`
    sets it so that the summaries' step is the run's global step. Keras
    adds 1 in `on_train_batch_begin`: the next summaries are written at
    step `count + 1`.

    Args:
        callback: a `keras.callbacks.TensorBoard`.
        count: int, the batches counted as done.
    """
    callback._global_train_batch = count


def build_model_from_spec(model, data_spec):
    """Builds a compiled model's loss, metrics and optimizer from a dataset's `element_spec`,
    and stops Keras from building them again from a batch (`fit`'s first step).

    Works around keras-team/keras#20585 under MultiWorkerMirroredStrategy
    (see `keras_transformer.training.strategy.work_around_keras_multiworker`)
    with the model's private `_symbolic_build` and `_maybe_symbolic_build`.

    Args:
        model: a compiled `keras.Model`.
        data_spec: the `element_spec` of the dataset it will be fit on.
    """
    model._symbolic_build(data_batch=data_spec)
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def shared_sentencepiece_resource(model_proto, shared_name):
    """tensorflow-text's SentencePiece model resource, created with a `shared_name`.

    tensorflow-text creates the model resource without a shared name, which
    makes it private to the op kernel that created it: anything that clears
    the eager kernel cache (`tf.random.set_seed`, and so
    `keras.utils.set_random_seed`) deletes it, and every later tokenize call
    fails with "Resource .../SentencepieceOp/... does not exist"
    (tensorflow/text#570). A shared name keeps it in the resource manager.
    Subclasses tensorflow-text's private `_SentencepieceModelResource`.

    Args:
        model_proto: the serialized SentencePiece model, bytes.
        shared_name: the resource's name in TensorFlow's resource manager.

    Returns:
        The resource, for `attach_sentencepiece_resource`.
    """
    import tensorflow as tf
    from tensorflow_text.python.ops import sentencepiece_tokenizer as tf_text_sp

    class SharedSentencepieceResource(tf_text_sp._SentencepieceModelResource):
        def __init__(self):
            self._shared_name = shared_name
            super().__init__(model_proto, name=None)

        def _create_resource(self):
            with tf.name_scope("SentenceTokenizerInitializer"):
                return tf_text_sp.gen_sentencepiece_tokenizer.sentencepiece_op(
                    model=self._model, shared_name=self._shared_name
                )

    return SharedSentencepieceResource()


def attach_sentencepiece_resource(tokenizer, resource):
    """Makes a `tensorflow_text.SentencepieceTokenizer` use `resource` for its model.

    The tokenizer keeps its model in the private `_model_resource`.

    Args:
        tokenizer: a `tensorflow_text.SentencepieceTokenizer`.
        resource: from `shared_sentencepiece_resource`.
    """
    tokenizer._model_resource = resource


def serialized_saved_model(export_dir):
    """The `SavedModel` protocol buffer of `export_dir/saved_model.pb` (to list its ops).

    TensorFlow exposes the proto class only under `tensorflow.core`.

    Args:
        export_dir: a SavedModel directory.

    Returns:
        A parsed `saved_model_pb2.SavedModel`.
    """
    import os

    import tensorflow as tf
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    with tf.io.gfile.GFile(os.path.join(os.fspath(export_dir), "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def swap_ema_weights(model):
    """Swaps a model's trainable weights with its optimizer's moving averages (`use_ema=True`), exactly.

    Calling it twice restores the weights bit for bit. Keras' own
    `SwapEMAWeights` swaps TensorFlow variables by additions and
    subtractions, which rounds the training weights at every swap and so
    changes training. The averages are the optimizer's private
    `_model_variables_moving_average`, in the order of its private
    `_trainable_variables`.

    Args:
        model: a `keras.Model` compiled with an optimizer built with
            `use_ema=True` (or a `LossScaleOptimizer` around one).
    """
    optimizer = getattr(model.optimizer, "inner_optimizer", model.optimizer)
    for variable, average in zip(optimizer._trainable_variables, optimizer._model_variables_moving_average):
        training_value = variable.numpy()
        variable.assign(average.numpy())
        average.assign(training_value)


def frozen_function(concrete_function):
    """`concrete_function` with the variables it reads turned into constants (for the LiteRT converter).

    The LiteRT export rewrites the frozen graph before converting it
    (`inference.litert_graph`); TensorFlow's freezing is its private
    `convert_to_constants.convert_variables_to_constants_v2`.

    Args:
        concrete_function: a `tf.function`'s concrete function.

    Returns:
        A concrete function of the same inputs and (flattened) outputs, without variables.
    """
    from tensorflow.python.framework import convert_to_constants

    # Control flow stays functional (While and If ops with their functions), as the converter takes it.
    return convert_to_constants.convert_variables_to_constants_v2(concrete_function, lower_control_flow=False)


def tflite_interpreter_with_custom_ops(model_path, custom_op_registerers, op_resolver_type=None, num_threads=None):
    """TensorFlow's LiteRT interpreter for `model_path`, with custom op registerers (tensorflow-text's ops).

    `tf.lite.Interpreter` takes no `custom_op_registerers`; its subclass
    that does, `InterpreterWithCustomOps`, is TensorFlow's private
    `tensorflow.lite.python.interpreter.InterpreterWithCustomOps` (the one
    tensorflow-text documents for its LiteRT ops).

    Args:
        model_path: a `.tflite` file.
        custom_op_registerers: functions (or names) that register custom ops, e.g.
            `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`.
        op_resolver_type: a `tf.lite.experimental.OpResolverType`; None: the default (XNNPACK where it applies).
        num_threads: the interpreter's threads; None: its default.

    Returns:
        The interpreter.
    """
    import tensorflow as tf
    from tensorflow.lite.python import interpreter

    return interpreter.InterpreterWithCustomOps(
        model_path=model_path,
        custom_op_registerers=list(custom_op_registerers),
        experimental_op_resolver_type=op_resolver_type or tf.lite.experimental.OpResolverType.AUTO,
        num_threads=num_threads,
    )


def tflite_operator_names(flatbuffer):
    """The name of every operator in every subgraph of a LiteRT flatbuffer; custom ops as "CUSTOM:<name>".

    Reads the flatbuffer with TensorFlow's private schema module
    `tensorflow.lite.python.schema_py_generated` (its public analyzer only prints a report).

    Args:
        flatbuffer: the model's bytes.

    Returns:
        A list of str, in subgraph and execution order.
    """
    from tensorflow.lite.python import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    builtin_names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    names = []
    for subgraph in model.subgraphs:
        for operator in subgraph.operators:
            code = model.operatorCodes[operator.opcodeIndex]
            # Codes past 127 live in `builtinCode` only; older ones in both (the deprecated field first).
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            name = builtin_names.get(builtin, str(builtin))
            names.append(f"CUSTOM:{code.customCode.decode()}" if name == "CUSTOM" else name)
    return names


def tflite_text_op_registerers():
    """tensorflow-text's LiteRT op registerers, for `tflite_interpreter_with_custom_ops`.

    They are `tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS`, the
    functions of its extension module `core/pybinds/tflite_registrar`. Importing
    the `tensorflow_text` package also imports its Keras layers, and so Keras;
    a LiteRT translator needs neither, so while the package is not imported
    the extension module is loaded from its file alone (a private path).

    Returns:
        A list of the registerer functions.
    """
    import importlib.util
    import os
    import sys

    name = "tensorflow_text.core.pybinds.tflite_registrar"
    if "tensorflow_text" in sys.modules:
        import tensorflow_text

        return list(tensorflow_text.tflite_registrar.SELECT_TFTEXT_OPS)
    if name not in _LOADED_EXTENSIONS:  # an extension module is initialized once per process
        import tensorflow  # noqa: F401  (loads libtensorflow_framework, which the extension links)

        package = importlib.util.find_spec("tensorflow_text")
        path = os.path.join(package.submodule_search_locations[0], "core", "pybinds", "tflite_registrar.so")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _LOADED_EXTENSIONS[name] = module
    module = _LOADED_EXTENSIONS[name]
    return [getattr(module, attr) for attr in sorted(dir(module)) if attr.startswith("Add")]


# Extension modules `tflite_text_op_registerers` loaded from their files, by module name.
_LOADED_EXTENSIONS = {}
