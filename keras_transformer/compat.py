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
