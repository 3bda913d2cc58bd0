"""The Transformer model: masks, cache, sizes, serialization and learning."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_transformer import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    Transformer,
    TransformerConfig,
    create_optimizer,
)
from keras_transformer.layers import EncoderLayer, FeedForward
from keras_transformer.run_dir import save_model_weights

VOCAB = 40


def tiny_model(**overrides):
    options = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    options.update(overrides)
    model = Transformer(TransformerConfig.tiny(vocab_size=VOCAB, **options))
    return model


def random_ids(rng, batch, length, pad_from=None):
    ids = rng.integers(4, VOCAB, size=(batch, length))
    if pad_from is not None:
        for row, start in enumerate(pad_from):
            ids[row, start:] = 0
    return ids


@pytest.mark.parametrize("norm_first", [False, True])
def test_logits_before_t_do_not_depend_on_targets_at_or_after_t(norm_first):
    rng = np.random.default_rng(0)
    model = tiny_model(norm_first=norm_first)
    source = random_ids(rng, 2, 6, pad_from=[6, 4])
    target = random_ids(rng, 2, 7)
    logits = np.asarray(model((source, target)))
    for t in (1, 3, 6):
        changed = target.copy()
        changed[:, t:] = rng.integers(4, VOCAB, size=changed[:, t:].shape)
        other = np.asarray(model((source, changed)))
        np.testing.assert_allclose(other[:, :t], logits[:, :t], atol=1e-5)
        assert not np.allclose(other[:, t:], logits[:, t:], atol=1e-3)


@pytest.mark.parametrize("positional_encoding", ["sinusoidal", "learned"])
def test_source_padding_is_invisible(positional_encoding):
    rng = np.random.default_rng(1)
    model = tiny_model(positional_encoding=positional_encoding)
    source = random_ids(rng, 2, 6, pad_from=[6, 3])
    target = random_ids(rng, 2, 5, pad_from=[5, 4])
    logits = np.asarray(model((source, target)))
    real = target != 0
    # More padding on the source and the target: real positions unchanged.
    more_source = np.concatenate([source, np.zeros((2, 4), int)], axis=1)
    more_target = np.concatenate([target, np.zeros((2, 3), int)], axis=1)
    padded = np.asarray(model((more_source, more_target)))[:, :5]
    np.testing.assert_allclose(padded[real], logits[real], atol=1e-5)
    # Changing what sits under the padding (the ids are 0 there; a different
    # sentence of the same real prefix) changes nothing either: only the
    # prefix matters, so a second sentence cut to its prefix agrees.
    alone = np.asarray(model((source[1:, :3], target[1:, :4])))
    np.testing.assert_allclose(alone[0], logits[1, :4], atol=1e-5)


def test_cached_decoding_equals_full_pass():
    rng = np.random.default_rng(2)
    for norm_first in (False, True):
        model = tiny_model(norm_first=norm_first)
        source = random_ids(rng, 3, 7, pad_from=[7, 5, 2])
        target = random_ids(rng, 3, 6)
        memory = model.encode(source)
        full = np.asarray(model.decode(target, memory, source))
        cache = model.init_cache(memory, max_length=6)
        steps = []
        for t in range(6):
            logits, cache = model.decode_step(target[:, t : t + 1], memory, source, cache, t)
            steps.append(np.asarray(logits))
        np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
        # The transposed output matrix rides along in the cache (computed once per search);
        # a cache without it (the decoder's own) gives the same logits.
        np.testing.assert_array_equal(
            np.asarray(cache["shared"]["output_kernel"]), np.asarray(model.output_projection.embeddings).T
        )
        plain = model.decoder.init_cache(memory, 6)
        first, plain = model.decode_step(target[:, :1], memory, source, plain, 0)
        assert "shared" not in plain
        np.testing.assert_allclose(np.asarray(first), steps[0], atol=1e-6)


def expected_parameter_count(c):
    """Parameters from the layer shapes of §3 (shared embeddings, no attention biases)."""
    attention = c.d_model * c.num_heads * (2 * c.key_dim + c.value_dim) + c.num_heads * c.value_dim * c.d_model
    feed_forward = c.d_model * c.d_ff + c.d_ff + c.d_ff * c.d_model + c.d_model
    layer_norm = 2 * c.d_model
    encoder_layer = attention + feed_forward + 2 * layer_norm
    decoder_layer = 2 * attention + feed_forward + 3 * layer_norm
    final_norms = 2 * layer_norm if c.norm_first else 0
    return c.vocab_size * c.d_model + c.num_layers * (encoder_layer + decoder_layer) + final_norms


@pytest.mark.parametrize(
    "preset, paper_millions",
    [("base", 65), ("big", 213), ("small", None), ("tiny", None)],
)
def test_parameter_counts_match_layer_shapes_and_table_3(preset, paper_millions):
    config = TransformerConfig.from_preset(preset, vocab_size=37000)
    model = Transformer(config)
    model.build()
    count = model.count_params()
    assert count == expected_parameter_count(config)
    if paper_millions:
        # Table 3 lists 65M (base) and 213M (big) for a 37k shared vocabulary.
        assert abs(count / 1e6 - paper_millions) / paper_millions < 0.05


def test_unshared_embeddings_have_three_matrices():
    config = TransformerConfig.tiny(vocab_size=VOCAB, share_embeddings=False)
    model = Transformer(config)
    model.build()
    assert model.count_params() == expected_parameter_count(config) + 2 * VOCAB * config.d_model


def test_compile_defaults_to_the_paper():
    """§5.3's Adam on equation (3) for this model's d_model, and §5.4's label smoothing of this model's config."""
    model = tiny_model()
    model.compile()
    assert model.loss.label_smoothing == pytest.approx(0.1)
    optimizer = model.optimizer
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert type(optimizer._learning_rate).__name__ == "TransformerSchedule"
    for iterations in (0, 99, 3999, 9999):  # step_num = iterations + 1
        step = iterations + 1
        equation_3 = 32**-0.5 * min(step**-0.5, step * 4000**-1.5)  # tiny_model's d_model is 32
        assert float(optimizer._learning_rate(iterations)) == pytest.approx(equation_3, rel=1e-5)
    smoothed = tiny_model(label_smoothing=0.2)
    smoothed.compile()
    assert smoothed.loss.label_smoothing == pytest.approx(0.2)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=[])
    assert isinstance(model.optimizer, keras.optimizers.SGD)


def test_keras_file_round_trip_in_a_fresh_process(tmp_path):
    rng = np.random.default_rng(3)
    model = tiny_model(dropout=0.1, share_embeddings=False, norm_first=True)
    model.compile()
    source, target = random_ids(rng, 2, 5), random_ids(rng, 2, 4)
    model.fit((source, target), target, epochs=1, verbose=0)
    expected = np.asarray(model((source, target)))
    path = tmp_path / "model.keras"
    model.save(path)
    np.save(tmp_path / "source.npy", source)
    np.save(tmp_path / "target.npy", target)
    script = textwrap.dedent(
        f"""
        import numpy as np, keras
        import keras_transformer  # registers the classes
        model = keras.saving.load_model({str(path)!r})
        source = np.load({str(tmp_path / "source.npy")!r})
        target = np.load({str(tmp_path / "target.npy")!r})
        np.save({str(tmp_path / "reloaded.npy")!r}, np.asarray(model((source, target))))
        assert model.optimizer.iterations.numpy() == 1
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)
    np.testing.assert_array_equal(np.load(tmp_path / "reloaded.npy"), expected)


def test_reloading_a_compiled_model_restores_its_optimizer_state_without_warnings(tmp_path, recwarn):
    """Untrained (a run's final model.keras): the step counter, quietly. Trained: every moment."""
    rng = np.random.default_rng(6)
    untrained = tiny_model()
    untrained.build()
    untrained.compile()
    untrained.save(tmp_path / "untrained.keras")
    reloaded = keras.saving.load_model(tmp_path / "untrained.keras")
    assert not [w for w in recwarn if "Skipping variable loading" in str(w.message)]
    assert int(reloaded.optimizer.iterations.numpy()) == 0
    assert reloaded.optimizer.built and all(not np.any(v.numpy()) for v in reloaded.optimizer.variables)

    trained = tiny_model()
    trained.compile()
    source, target = random_ids(rng, 2, 5), random_ids(rng, 2, 4)
    trained.fit((source, target), target, epochs=2, verbose=0)
    trained.save(tmp_path / "trained.keras")
    reloaded = keras.saving.load_model(tmp_path / "trained.keras")
    assert int(reloaded.optimizer.iterations.numpy()) == 2
    saved, restored = trained.optimizer.variables, reloaded.optimizer.variables
    assert len(saved) == len(restored) > 2
    for a, b in zip(saved, restored):
        np.testing.assert_array_equal(a.numpy(), b.numpy())

    # A training checkpoint has no optimizer state: loading it keeps the optimizer's own.
    save_model_weights(trained, str(tmp_path / "ckpt.weights.h5"))
    reloaded.load_weights(tmp_path / "ckpt.weights.h5")
    assert int(reloaded.optimizer.iterations.numpy()) == 2
    for a, b in zip(trained.weights, reloaded.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not [w for w in recwarn if "Skipping variable loading" in str(w.message)]


@keras.saving.register_keras_serializable(package="tests")
class GeluEncoderLayer(EncoderLayer):
    """An encoder layer with a GELU feed-forward network, as a user would subclass it."""

    def __init__(self, num_heads, d_ff, gelu_approximate=True, **kwargs):
        super().__init__(num_heads, d_ff, **kwargs)
        self.gelu_approximate = gelu_approximate

    def make_feed_forward(self):
        activation = lambda x: keras.activations.gelu(x, approximate=self.gelu_approximate)  # noqa: E731
        return FeedForward(self.d_ff, activation=activation, name="feed_forward")

    def get_config(self):
        return {**super().get_config(), "gelu_approximate": self.gelu_approximate}


def test_subclassed_layer_round_trip(tmp_path):
    inputs = keras.Input((6, 16))
    outputs = GeluEncoderLayer(num_heads=2, d_ff=32, gelu_approximate=False, dropout=0.0)(inputs)
    model = keras.Model(inputs, outputs)
    x = np.random.default_rng(4).normal(size=(2, 6, 16)).astype("float32")
    path = tmp_path / "subclass.keras"
    model.save(path)
    restored = keras.saving.load_model(path)
    layer = restored.layers[-1]
    assert isinstance(layer, GeluEncoderLayer) and layer.gelu_approximate is False
    np.testing.assert_array_equal(restored(x), model(x))


def test_tiny_model_learns_to_copy():
    rng = np.random.default_rng(5)
    keras.utils.set_random_seed(5)
    model = tiny_model(num_layers=2, d_model=64, num_heads=4, d_ff=128, dropout=0.0)
    model.compile(optimizer=create_optimizer(64, warmup_steps=100))
    sequences = rng.integers(4, 14, size=(2048, 6))
    source = sequences
    target_in = np.concatenate([np.full((2048, 1), 2), sequences], axis=1)  # start token 2
    target_out = np.concatenate([sequences, np.full((2048, 1), 3)], axis=1)  # end token 3
    model.fit((source, target_in), target_out, batch_size=32, epochs=8, verbose=0)  # 512 steps
    test = rng.integers(4, 14, size=(256, 6))
    test_in = np.concatenate([np.full((256, 1), 2), test], axis=1)
    test_out = np.concatenate([test, np.full((256, 1), 3)], axis=1)
    predictions = np.asarray(model((test, test_in))).argmax(-1)
    accuracy = (predictions == test_out).mean()
    assert accuracy > 0.98, accuracy


def test_mixed_bfloat16_model_keeps_float32_variables_and_decoding_logits():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = tiny_model()
    rng = np.random.default_rng(6)
    source, target = random_ids(rng, 2, 5), random_ids(rng, 2, 4)
    logits = model((source, target))
    assert logits.dtype == "bfloat16"  # training logits: the loss casts inside its kernel
    assert model.decode(target, model.encode(source), source).dtype == "float32"
    assert all(w.dtype == "float32" for w in model.weights)


def test_mixed_bfloat16_model_reads_float_token_ids_exactly():
    """Ids that arrive as floats reach the embeddings unrounded: bfloat16 holds integers exactly only up to
    256, so an autocast of the inputs would turn 7999 into 8000 (out of range) and 4001 into 4000."""
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model = Transformer(TransformerConfig.tiny(vocab_size=8000))
    source, target = np.array([[7999, 3001, 257, 5, 0]]), np.array([[2, 4001, 6, 0]])
    as_ints = model((source, target))
    as_floats = model((source.astype("float32"), target.astype("float32")))
    np.testing.assert_array_equal(
        np.asarray(keras.ops.cast(as_floats, "float32")), np.asarray(keras.ops.cast(as_ints, "float32"))
    )


# The loss and the metric -----------------------------------------------------------


def test_masked_accuracy_counts_tied_logits_like_argmax():
    """Of tied maximal logits only the first index is the prediction, as in SparseCategoricalAccuracy."""
    logits = np.array([[[0, 2, 2, 1], [0, 2, 2, 1], [3, 3, 3, 3], [1, 0, 0, 0], [0, 0, 5, 0]]], "float32")
    labels = np.array([[1, 2, 3, 0, 2]])  # tie won, tie lost, tie lost, padding, clear win
    metric = MaskedAccuracy()
    metric.update_state(labels, logits)
    assert float(metric.result()) == pytest.approx(2 / 4)
    reference = keras.metrics.SparseCategoricalAccuracy()
    reference.update_state(labels, logits, sample_weight=labels != 0)
    assert float(reference.result()) == pytest.approx(2 / 4)


def test_masked_accuracy_does_not_count_bfloat16_ties_as_right():
    """1.0 and 1.001 differ in float32 but tie in bfloat16: the later label is no longer predicted."""
    logits = np.array([[[1.0, 1.001, 0.0], [0.0, 1.0, 1.001]]], "float32")
    labels = np.array([[1, 2]])
    for dtype, expected in (("float32", 1.0), ("bfloat16", 0.0)):
        metric = MaskedAccuracy()
        metric.update_state(labels, keras.ops.cast(logits, dtype))
        assert float(metric.result()) == expected, dtype


def test_losses_and_layers_import_no_pipeline_module():
    """The model side imports no TensorFlow at module level and nothing of the training pipeline."""
    import ast
    import pathlib

    import keras_transformer

    package = pathlib.Path(keras_transformer.__file__).parent
    # compat.py imports nothing at module level (its private-API imports are inside its functions).
    allowed = {
        "dataclasses",
        "functools",
        "math",
        "typing",
        "keras",
        "keras_transformer.kernels",
        "keras_transformer.layers",
        "keras_transformer.special_ids",
        "keras_transformer.compat",
    }
    for path in [package / "losses.py", *sorted((package / "layers").glob("*.py"))]:
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are fine
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for name in names:
                assert any(name == a or name.startswith(a + ".") for a in allowed), (path.name, name)


def test_loss_divides_by_the_global_token_count_across_replicas():
    """Two replicas with 3 and 1 real tokens: the sum of their losses is the one-device mean, and each replica's
    `global_token_count` is the 4 of the whole batch."""
    script = textwrap.dedent(
        """
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import numpy as np
        from keras_transformer.losses import LabelSmoothedCrossEntropy, global_token_count

        labels = np.array([[5, 6, 7, 0], [5, 0, 0, 0]])
        logits = np.random.default_rng(0).normal(size=(2, 4, 10)).astype("float32")
        loss = LabelSmoothedCrossEntropy(0.1)
        one_device = float(loss(labels, logits))
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        batches = strategy.experimental_distribute_dataset(
            tf.data.Dataset.from_tensor_slices((labels, logits)).batch(2))
        per_replica = strategy.run(tf.function(loss), args=next(iter(batches)))
        assert [int(tf.reduce_sum(tf.cast(y != 0, tf.int32))) for y in
                strategy.experimental_local_results(next(iter(batches))[0])] == [3, 1]
        total = float(strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None))
        assert abs(total - one_device) < 1e-5, (total, one_device)
        counts = strategy.run(tf.function(lambda y, z: global_token_count(y, 0)), args=next(iter(batches)))
        assert [float(c) for c in strategy.experimental_local_results(counts)] == [4.0, 4.0]
        """
    )
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    subprocess.run([sys.executable, "-c", script], check=True, env=env, timeout=300)


def test_transformer_passes_the_keras_layer_test():
    """The model through Keras's layer harness: config and serialization round trips, a training step, and
    mixed_float16 logits of the dtype of their symbolic spec."""
    from keras.src import testing

    config = TransformerConfig.tiny(vocab_size=30, num_layers=1).to_dict()

    class Case(testing.TestCase):
        def runTest(self):
            self.run_layer_test(
                Transformer,
                init_kwargs={"config": config},
                input_data=(np.array([[5, 6, 3], [7, 3, 0]], "int32"), np.array([[2, 8], [2, 9]], "int32")),
                expected_output_shape=(2, 2, 30),
                run_training_check=False,  # integer inputs: the harness's step needs float inputs
            )

    Case().runTest()


@pytest.mark.parametrize("dtype", ["float32", "mixed_bfloat16"])
def test_empty_rows_change_neither_the_loss_nor_the_accuracy(dtype):
    """Rows of padding only (`make_batches` fills a partial batch with them up to a multiple of the replicas)
    give finite logits and count for nothing: the batch's loss and accuracy are those of its real rows."""
    rng = np.random.default_rng(3)
    options = dict(num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    model = Transformer(TransformerConfig.tiny(vocab_size=VOCAB, **options), dtype=dtype)
    source, target = random_ids(rng, 3, 6, pad_from=[6, 4, 5]), random_ids(rng, 3, 7, pad_from=[7, 5, 6])
    labels = np.concatenate([target[:, 1:], np.zeros((3, 1), target.dtype)], axis=1)
    empty = np.zeros((2, 6), source.dtype), np.zeros((2, 7), target.dtype)
    padded = np.concatenate([source, empty[0]]), np.concatenate([target, empty[1]])
    padded_labels = np.concatenate([labels, empty[1]])
    loss, accuracy = LabelSmoothedCrossEntropy(0.1), MaskedAccuracy()
    logits = model((source, target))
    padded_logits = model(padded)
    assert np.isfinite(np.asarray(keras.ops.cast(padded_logits, "float32"))).all()
    np.testing.assert_allclose(float(loss(padded_labels, padded_logits)), float(loss(labels, logits)), rtol=1e-6)
    accuracy.update_state(labels, logits)
    alone = float(accuracy.result())
    accuracy.reset_state()
    accuracy.update_state(padded_labels, padded_logits)
    assert float(accuracy.result()) == alone
