"""Gradient accumulation (`training.accumulation`, `--accumulate-steps K`): K batches, one update of all their tokens.

The batches of an update hold different numbers of real tokens: the update
must follow the gradient of the mean over all their tokens, not the mean of
the K batches' means, with the optimizer counting updates (the schedule of
§5.3). Tiny models, dropout 0.

The MirroredStrategy test runs this file as a script in a fresh process
(logical devices must be configured before TensorFlow starts):

    python tests/test_accumulation.py mirrored
        Two logical CPU devices. Prints one JSON line: the largest
        differences between accumulation under MirroredStrategy and the
        one-device references, and the target tokens of each batch's halves.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent
K = 4  # batches per update
UPDATES = 3
VOCAB = 50
# (sentences, padded length) of the batches, in turn: unequal token counts, and shapes that
# also split over two replicas.
SHAPES = ((2, 5), (6, 3), (4, 9), (2, 12))


def _batches(count, seed=4):
    """`count` batches `((source, target_in), labels)` of SHAPES in turn, each row with its own length;
    the second has no real target token (all labels padding)."""
    rng = np.random.default_rng(seed)
    batches = []
    for i in range(count):
        rows, length = SHAPES[(i + i // K) % len(SHAPES)]
        source = rng.integers(3, VOCAB, (rows, length + 1)).astype("int32")
        target = rng.integers(3, VOCAB, (rows, length + 1)).astype("int32")
        for row in range(rows):
            source[row, rng.integers(1, length + 1) :] = 0
            target[row, rng.integers(1, length + 1) :] = 0
        if i == 1:
            target[:, 1:] = 0
        batches.append(((source, target[:, :-1]), target[:, 1:]))
    return batches


def _tokens(batch):
    return int(np.count_nonzero(batch[1]))


def _concatenated(batches):
    """One batch of the sentences of `batches`, padded to the longest."""

    def stack(arrays):
        width = max(a.shape[1] for a in arrays)
        return np.concatenate([np.pad(a, [(0, 0), (0, width - a.shape[1])]) for a in arrays])

    return (stack([b[0][0] for b in batches]), stack([b[0][1] for b in batches])), stack([b[1] for b in batches])


def _dataset(batches):
    import tensorflow as tf

    spec = tf.TensorSpec([None, None], tf.int32)
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=((spec, spec), spec))


def _model(optimizer, strategy=None, **compile_options):
    """The same tiny Transformer every call (seeded), compiled with `optimizer()` and built."""
    import keras
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig

    keras.utils.set_random_seed(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        model = Transformer(TransformerConfig.tiny(vocab_size=VOCAB, dropout=0.0))
        model.compile(optimizer=optimizer(), **compile_options)
        model.optimizer.build(model.trainable_variables)
    return model


def _fit(model, batches, steps, accumulate=1):
    from keras_transformer.training.accumulation import accumulate_gradients

    accumulate_gradients(model, accumulate)
    model.fit(_dataset(batches), epochs=1, steps_per_epoch=steps, shuffle=False, verbose=0)
    return model


def _sgd():
    import keras

    return keras.optimizers.SGD(learning_rate=1.0)  # w1 = w0 - g: the weights show the gradient


def _papers_optimizer(ema=None):
    from keras_transformer.optimization import create_optimizer

    extra = dict(use_ema=True, ema_momentum=ema) if ema else {}
    return lambda: create_optimizer(32, warmup_steps=4, **extra)  # FusedAdam on TransformerSchedule


def _applied_gradient(batches, strategy=None):
    """The gradient the first update of K accumulated `batches` applies (SGD, learning rate 1)."""
    model = _model(_sgd, strategy)
    before = [w.copy() for w in model.get_weights()]
    _fit(model, batches, 1, accumulate=len(batches))
    return [b - a for a, b in zip(model.get_weights(), before)]


def _tape_gradients(batches):
    """Per batch: its real tokens and the gradient of its mean loss, taken with a tape on one device."""
    import tensorflow as tf

    model = _model(_sgd)
    gradients = []
    for x, y in batches:
        with tf.GradientTape() as tape:
            loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
        gradients.append([np.asarray(g) for g in tape.gradient(loss, model.trainable_variables)])
    return [_tokens(b) for b in batches], gradients


def _max_difference(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


def test_k_batches_apply_the_gradient_of_the_mean_over_all_their_tokens():
    """sum_i n_i g_i / sum_i n_i, g_i the gradient of batch i's mean over its n_i tokens (one batch has none);
    not the mean of the g_i, nor sum_i n_i g_i / K."""
    batches = _batches(K)
    tokens, gradients = _tape_gradients(batches)
    assert len(set(tokens)) == K, tokens
    total = sum(tokens)
    expected = [sum(n * g[v] for n, g in zip(tokens, gradients)) / total for v in range(len(gradients[0]))]
    mean_of_means = [sum(g[v] for g in gradients) / K for v in range(len(gradients[0]))]
    scale = max(float(np.max(np.abs(g))) for g in expected)
    assert _max_difference(expected, mean_of_means) > 0.05 * scale  # the two differ: the test tells them apart

    applied = _applied_gradient(batches)
    for got, want in zip(applied, expected):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6 * scale)
    one_batch = _model(_sgd)
    before = one_batch.get_weights()
    _fit(one_batch, [_concatenated(batches)], 1)
    assert _max_difference(applied, [a - b for a, b in zip(before, one_batch.get_weights())]) < 1e-5 * scale


def test_under_loss_scaling_the_accumulated_update_divides_the_scale_out_once():
    """mixed_float16 (Keras wraps the optimizer in a LossScaleOptimizer): each batch's gradient is of the
    scaled loss, so that small float16 gradients survive, and the update divides the scale out once. SGD
    shows the update itself: float32's, up to float16 rounding, and not 1 / scale of it (the loss left
    unscaled) nor scale times it."""
    import keras

    batches = _batches(K)
    expected = _applied_gradient(batches)
    keras.mixed_precision.set_global_policy("mixed_float16")
    model = _model(_sgd)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    scale = float(model.optimizer.dynamic_scale.numpy())
    assert scale > 1000
    before = [w.copy() for w in model.get_weights()]
    _fit(model, batches, 1, accumulate=K)
    assert float(model.optimizer.dynamic_scale.numpy()) == scale  # the update was applied, not skipped
    applied = [b - a for a, b in zip(model.get_weights(), before)]
    norm = lambda gradient: np.sqrt(sum(float(np.sum(np.square(g))) for g in gradient))  # noqa: E731
    assert norm(applied) / norm(expected) == pytest.approx(1.0, abs=0.05)
    assert _max_difference(applied, expected) < 0.1 * max(float(np.max(np.abs(g))) for g in expected)


@pytest.mark.parametrize("ema", [None, 0.9])
def test_k_batches_train_like_one_batch_of_them_all_with_the_papers_optimizer(ema):
    """FusedAdam on equation (3): UPDATES updates of K batches each leave the weights of UPDATES updates on
    the K batches concatenated (with `--ema`, the moving average, which `fit` leaves in the weights); the
    learning rate is that of update UPDATES, not of update UPDATES * K."""
    from keras_transformer.optimization import TransformerSchedule
    from keras_transformer.training.callbacks import current_learning_rate

    batches = _batches(K * UPDATES)
    assert len({sum(_tokens(b) for b in batches[u * K : (u + 1) * K]) for u in range(UPDATES)}) == UPDATES
    accumulated = _fit(_model(_papers_optimizer(ema)), batches, UPDATES, accumulate=K)
    concatenated = [_concatenated(batches[u * K : (u + 1) * K]) for u in range(UPDATES)]
    reference = _fit(_model(_papers_optimizer(ema)), concatenated, UPDATES)
    untrained = _model(_papers_optimizer(ema))

    assert int(accumulated.optimizer.iterations.numpy()) == UPDATES
    schedule = TransformerSchedule(32, warmup_steps=4)
    assert current_learning_rate(accumulated.optimizer) == pytest.approx(float(schedule(UPDATES - 1)), rel=1e-6)
    moved = _max_difference(reference.get_weights(), untrained.get_weights())
    assert moved > 0.02
    np.testing.assert_allclose(
        np.concatenate([w.ravel() for w in accumulated.get_weights()]),
        np.concatenate([w.ravel() for w in reference.get_weights()]),
        atol=1e-3,
    )


def test_mirrored_strategy_accumulates_like_one_device():
    """Two replicas whose halves of each batch hold different numbers of tokens: the same gradient and
    the same weights after UPDATES updates with the paper's optimizer, and the same logged loss, as one device."""
    done = subprocess.run(
        [sys.executable, str(pathlib.Path(__file__).resolve()), "mirrored"],
        capture_output=True,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES=""),
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2
    assert any(a != b for a, b in result["half_tokens"]), result["half_tokens"]
    assert result["gradient_difference"] < 1e-5 * result["gradient_scale"]
    assert result["iterations"] == UPDATES and result["weight_difference"] < 1e-3
    # The logged loss is the batches' mean loss, as on one device: each replica's part times the replicas.
    assert result["logged_loss"] == pytest.approx(result["logged_loss_one_device"], rel=1e-5)


def _mirrored_worker():
    """The script's `mirrored` mode (see the module docstring)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    batches = _batches(K * UPDATES)
    tokens, gradients = _tape_gradients(batches[:K])
    expected = [sum(n * g[v] for n, g in zip(tokens, gradients)) / sum(tokens) for v in range(len(gradients[0]))]
    applied = _applied_gradient(batches[:K], strategy)
    accumulated = _fit(_model(_papers_optimizer(), strategy), batches, UPDATES, accumulate=K)
    one_device = _fit(_model(_papers_optimizer()), batches, UPDATES, accumulate=K)
    concatenated = [_concatenated(batches[u * K : (u + 1) * K]) for u in range(UPDATES)]
    reference = _fit(_model(_papers_optimizer()), concatenated, UPDATES)
    halves = [[int(np.count_nonzero(half)) for half in np.split(b[1], 2)] for b in batches]
    result = {
        "replicas": strategy.num_replicas_in_sync,
        "half_tokens": halves,
        "gradient_difference": _max_difference(applied, expected),
        "gradient_scale": max(float(np.max(np.abs(g))) for g in expected),
        "iterations": int(accumulated.optimizer.iterations.numpy()),
        "weight_difference": _max_difference(accumulated.get_weights(), reference.get_weights()),
        "logged_loss": accumulated.history.history["loss"][-1],
        "logged_loss_one_device": one_device.history.history["loss"][-1],
    }
    print(json.dumps(result))


def test_one_batch_per_update_leaves_training_as_it_is():
    """K = 1 installs nothing: Keras' own train step, and the same weights bit for bit."""
    from keras_transformer.training.accumulation import accumulate_gradients

    batches = _batches(3)
    plain = _model(_papers_optimizer())
    plain.fit(_dataset(batches), epochs=1, steps_per_epoch=3, shuffle=False, verbose=0)
    model = _model(_papers_optimizer())
    assert accumulate_gradients(model, 1) is None
    assert "make_train_function" not in vars(model)
    model.fit(_dataset(batches), epochs=1, steps_per_epoch=3, shuffle=False, verbose=0)
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_an_update_cut_short_by_the_end_of_the_data_is_not_applied():
    """K + 2 batches: one update; the 2 left over are dropped, and the accumulators emptied."""
    from keras_transformer.training.accumulation import accumulate_gradients

    batches = _batches(K + 2)
    model = _model(_sgd)
    accumulation = accumulate_gradients(model, K)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Your input ran out of data")
        model.fit(_dataset(batches), epochs=1, shuffle=False, verbose=0)
    one_update = _fit(_model(_sgd), batches[:K], 1, accumulate=K)
    assert int(model.optimizer.iterations.numpy()) == 1
    assert _max_difference(model.get_weights(), one_update.get_weights()) == 0.0
    assert all(not np.any(v.numpy()) for v in accumulation.sums + [accumulation.tokens])


def test_bad_accumulation_is_refused_by_name():
    import keras

    from keras_transformer.errors import ParameterError
    from keras_transformer.training import TrainingArgs
    from keras_transformer.training.accumulation import accumulate_gradients

    for value in (0, -2, 1.5, "4"):
        with pytest.raises(ParameterError, match=rf"^accumulate_steps must be a positive integer, got {value!r}\.$"):
            TrainingArgs(accumulate_steps=value)
        with pytest.raises(ValueError, match=r"^accumulate_steps must be a positive integer"):
            accumulate_gradients(None, value)
    model = _model(_sgd, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="weights each batch by its real tokens"):
        accumulate_gradients(model, 2)


def test_an_update_of_more_batches_than_a_pass_is_refused(spm500):
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.errors import ParameterError
    from keras_transformer.training import TrainingArgs
    from keras_transformer.training.stream import TrainingData

    def stream(accumulate_steps):
        args = TrainingArgs(vocab_size=500, batch_tokens=512, accumulate_steps=accumulate_steps)
        return TrainingData(args, Tokenizer(spm500), data.load_dataset("multi30k", "val"), 1, 24)

    batches = stream(1).steps_per_epoch()
    assert batches == stream(1).batches_per_epoch() > 3
    assert stream(3).steps_per_epoch() == batches // 3
    message = rf"^accumulate_steps \({batches + 1}\) is more than the {batches} batches"
    with pytest.raises(ParameterError, match=message):
        stream(batches + 1).steps_per_epoch()


def test_a_run_with_accumulation_records_it_and_resumes_exactly(tmp_path, spm500):
    """config.json records accumulate_steps; the optimizer and the logs count updates; a copy
    of the run at step 2 continued to step 4 ends with the uninterrupted run's weights (the data of step s
    starts at batch s * K)."""
    import keras
    from conftest import new_run_dir, read_csv

    from keras_transformer import training

    options = dict(
        preset="tiny",
        vocab_size=500,
        batch_tokens=1024,
        max_length=32,
        validation_split=None,
        warmup_steps=4,
        checkpoint_every=2,
        log_every=1,
        verbose=0,
        overrides={"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64},
        max_steps=4,
        accumulate_steps=3,
    )
    whole_dir = new_run_dir(tmp_path / "whole", spm500)
    copy_dir = tmp_path / "copy"

    class CopyAtStep2(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                shutil.copytree(whole_dir, copy_dir)

    whole = training.train(training.TrainingArgs(output=str(whole_dir), **options), callbacks=[CopyAtStep2()])
    resumed = training.train(training.TrainingArgs(output=str(copy_dir), **options))
    assert (whole.step, resumed.step, resumed.resumed_from) == (4, 4, 2)
    for a, b in zip(whole.model.get_weights(), resumed.model.get_weights()):
        np.testing.assert_array_equal(a, b)
    config = json.loads((whole_dir / "config.json").read_text())
    assert config["training"]["accumulate_steps"] == 3
    state = json.loads((whole_dir / "backup" / "state.json").read_text())
    assert (state["step"], state["iterations"]) == (4, 4)
    assert [int(row["step"]) for row in read_csv(whole_dir / "steps.csv")] == [1, 2, 3, 4]


def test_the_wmt14_example_makes_the_papers_batch_on_the_gpus_it_has(monkeypatch, capsys):
    """25000 tokens per update (§5.1) with at most the 3125 tokens of each of the paper's 8 GPUs (§5.2)
    on each GPU at a time; given flags win; without GPUs, the paper's batch in one step."""
    import importlib.util

    from keras_transformer import hardware

    spec = importlib.util.spec_from_file_location("train_wmt14", ROOT / "examples" / "train_wmt14.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    def planned(argv, gpus=()):
        monkeypatch.setattr(hardware, "gpu_compute_capabilities", lambda: [(8, 0)] * len(gpus))
        args = example.main(argv + ["--dry-run"])
        return args.batch_tokens, args.accumulate_steps

    assert planned([]) == (25000, 1)
    assert planned([], gpus=[0, 1]) == (6250, 4)
    assert planned([], gpus=range(8)) == (25000, 1)
    assert planned(["--gpus", "1"]) == (3125, 8)
    assert planned(["--gpus", "3"]) == (8333, 3)
    assert planned(["--gpus", "2", "--accumulate-steps", "2"]) == (6250, 2)
    assert planned(["--recipe", "big", "--gpus", "4"]) == (12500, 2)
    capsys.readouterr()
    with pytest.raises(SystemExit, match=r"^--gpus 0: must be at least 1\.$"):
        example.main(["--gpus", "0", "--dry-run"])


if __name__ == "__main__" and sys.argv[1:] == ["mirrored"]:
    _mirrored_worker()
