"""R-Drop (`training.rdrop`, `--rdrop-alpha`): two dropout masks per batch, their divergence in the loss.

Dropout draws masks no two devices share, so the tests that compare losses
and gradients use `SecondPassScaled`: a Transformer without dropout whose
second pass (the batch's second copy) has its logits scaled, two passes
that differ the same way on every device.

The MirroredStrategy test runs this file as a script in a fresh process
(logical devices must be configured before TensorFlow starts):

    python tests/test_rdrop.py mirrored
        Two logical CPU devices. Prints one JSON line: the largest
        differences between R-Drop's first update under MirroredStrategy
        and on one device, without and with gradient accumulation.
"""

import json
import os
import pathlib
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

VOCAB = 40
ALPHA = 5.0


def _batches(count, seed=3):
    """`count` batches `((source, target_in), labels)` of 4 rows; each row has its own length, so the halves
    that two replicas take hold different numbers of tokens, and so do the batches of an update."""
    rng = np.random.default_rng(seed)
    batches = []
    for i in range(count):
        source = rng.integers(3, VOCAB, (4, 7)).astype("int32")
        target = rng.integers(3, VOCAB, (4, 8)).astype("int32")
        for row, length in enumerate(((2, 7, 4, 6), (8, 3, 2, 2))[i % 2]):
            source[row, length:] = 0
            target[row, length:] = 0
        batches.append(((source, target[:, :-1]), target[:, 1:]))
    return batches


def _model_class():
    import keras
    from keras import ops

    from keras_transformer import Transformer

    class SecondPassScaled(Transformer):
        """The second half of the rows' logits times 1.5: two passes that differ without dropout."""

        def call(self, inputs, training=None):
            logits = super().call(inputs, training=training)
            first, second = ops.split(logits, 2, axis=0)
            return ops.concatenate([first, 1.5 * second], axis=0)

    return keras, SecondPassScaled


def _model(dropout=0.0, scaled=True, strategy=None, optimizer=None):
    """A tiny seeded Transformer, compiled and built (SGD with learning rate 1 unless told), with R-Drop
    installed: `(model, rdrop)`."""
    import tensorflow as tf

    keras, scaled_class = _model_class()
    from keras_transformer import Transformer, TransformerConfig
    from keras_transformer.training.rdrop import RDropDivergence, use_rdrop

    keras.utils.set_random_seed(0)
    with (strategy or tf.distribute.get_strategy()).scope():
        model = (scaled_class if scaled else Transformer)(TransformerConfig.tiny(vocab_size=VOCAB, dropout=dropout))
        divergence = RDropDivergence()
        model.compile(optimizer=optimizer or keras.optimizers.SGD(learning_rate=1.0), metrics=[divergence])
        model.build()
        model.optimizer.build(model.trainable_variables)
    return model, use_rdrop(model, ALPHA, divergence)


def _divergence(model, x, y):
    """The mean symmetric divergence of the two passes of batch `(x, y)` (no dropout: `SecondPassScaled`)."""
    import tensorflow as tf

    from keras_transformer.training.rdrop import mean_symmetric_kl

    logits = model((tf.concat([x[0], x[0]], 0), tf.concat([x[1], x[1]], 0)), training=True)
    return float(mean_symmetric_kl(logits, y, pad_id=0))


def _tape(function, model):
    import tensorflow as tf

    with tf.GradientTape() as tape:
        value = function()
        loss = value[0] if isinstance(value, tuple) else value
    return value, [np.asarray(g) for g in tape.gradient(loss, model.trainable_variables)]


def _reference_loss(model, x, y, alpha):
    """R-Drop's equation (3) over the batch's real tokens, divided by twice their count, written out: the
    label-smoothed cross-entropy of each pass and KL(p1 || p2) and KL(p2 || p1) by their definition."""
    import tensorflow as tf

    from keras_transformer.losses import smoothed_token_loss

    logits = model((tf.concat([x[0], x[0]], 0), tf.concat([x[1], x[1]], 0)), training=True)
    first, second = tf.split(tf.cast(logits, "float32"), 2)
    mask = tf.cast(y != 0, "float32")
    cross_entropy = smoothed_token_loss(first, y, 0.1) + smoothed_token_loss(second, y, 0.1)
    log_p, log_q = tf.nn.log_softmax(first), tf.nn.log_softmax(second)
    kl_pq = tf.reduce_sum(tf.exp(log_p) * (log_p - log_q), -1)
    kl_qp = tf.reduce_sum(tf.exp(log_q) * (log_q - log_p), -1)
    total = tf.reduce_sum((cross_entropy + alpha * 0.5 * (kl_pq + kl_qp)) * mask)
    return total / (2.0 * tf.reduce_sum(mask))


def test_symmetric_kl_is_half_the_sum_of_both_divergences():
    from keras_transformer.training.rdrop import symmetric_kl

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 3, 5, 11)).astype("float32")
    p = np.exp(a) / np.exp(a).sum(-1, keepdims=True)
    q = np.exp(b) / np.exp(b).sum(-1, keepdims=True)
    expected = 0.5 * ((p * np.log(p / q)).sum(-1) + (q * np.log(q / p)).sum(-1))
    np.testing.assert_allclose(symmetric_kl(a, b), expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(symmetric_kl(a, a), 0.0, atol=1e-7)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_fused_divergence_equals_the_plain_form_in_value_and_gradient(dtype):
    """`kernels.divergence` against `symmetric_kl` differentiated by TensorFlow; a padded position adds nothing
    and gets a zero gradient even with non-finite logits."""
    import tensorflow as tf

    from keras_transformer.kernels.divergence import weighted_divergence_with_gradient
    from keras_transformer.training.rdrop import symmetric_kl

    rng = np.random.default_rng(1)
    logits = tf.cast(3.0 * rng.normal(size=(4, 5, 17)).astype("float32"), dtype)
    weights = tf.constant(rng.uniform(0.1, 1.0, (2, 5)).astype("float32") * (np.arange(5) < [[5], [3]]))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        fused = 2.5 * weighted_divergence_with_gradient(logits, weights)
        first, second = tf.split(logits, 2)
        plain = 2.5 * tf.reduce_sum(symmetric_kl(first, second) * weights)
    tolerance = dict(rtol=1e-5, atol=1e-6) if dtype == "float32" else dict(rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(float(fused), float(plain), **tolerance)
    fused_gradient, plain_gradient = (tape.gradient(v, logits) for v in (fused, plain))
    assert fused_gradient.dtype == logits.dtype
    np.testing.assert_allclose(tf.cast(fused_gradient, "float32"), tf.cast(plain_gradient, "float32"), **tolerance)
    padded = tf.tensor_scatter_nd_update(logits, [[1, 4, 0], [3, 4, 2]], tf.constant([np.inf, np.nan], dtype))
    with tf.GradientTape() as tape:
        tape.watch(padded)
        value = weighted_divergence_with_gradient(padded, weights)
    np.testing.assert_allclose(float(value), float(fused) / 2.5, **tolerance)
    assert np.all(np.isfinite(tf.cast(tape.gradient(value, padded), "float32")))


def test_the_loss_and_its_gradient_are_r_drops_equation_over_real_tokens():
    """Both passes' cross-entropy plus alpha times the symmetric divergence, padding excluded, over twice the
    real tokens; the divergence's gradient reaches both passes (neither is held fixed)."""
    model, rdrop = _model()
    (x, y) = _batches(1)[0]
    (loss, first), gradients = _tape(lambda: rdrop.forward(x, y), model)
    expected, expected_gradients = _tape(lambda: _reference_loss(model, x, y, ALPHA), model)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert _divergence(model, x, y) > 0.01
    assert float(rdrop.divergence.result()) == pytest.approx(_divergence(model, x, y), rel=1e-5)
    assert first.shape[0] == 4
    for g, e in zip(gradients, expected_gradients):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


def test_without_dropout_r_drop_is_the_papers_loss_and_gradient():
    """Two passes without dropout agree: divergence 0, and the loss and gradient of one pass."""
    model, rdrop = _model(scaled=False)
    (x, y) = _batches(1)[0]
    (loss, _), gradients = _tape(lambda: rdrop.forward(x, y), model)
    plain, plain_gradients = _tape(lambda: model.compute_loss(x, y, model(x, training=True), training=True), model)
    assert abs(float(rdrop.divergence.result())) < 1e-6
    assert float(loss) == pytest.approx(float(plain), rel=1e-6)
    for g, e in zip(gradients, plain_gradients):
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-6)


def test_each_pass_draws_its_own_dropout_masks():
    _, rdrop = _model(dropout=0.3, scaled=False)
    (x, y) = _batches(1)[0]
    rdrop.forward(x, y)
    assert float(rdrop.divergence.result()) > 1e-3


def test_fit_trains_with_r_drop_and_logs_the_divergence_with_and_without_accumulation():
    """Installed, `fit` takes R-Drop's train step; under accumulation the accumulated step takes its forward."""
    import keras
    import tensorflow as tf

    from keras_transformer.training.accumulation import accumulate_gradients

    spec = tf.TensorSpec([None, None], tf.int32)
    batches = _batches(4)
    for steps in (1, 2):
        model, rdrop = _model(dropout=0.3, scaled=False, optimizer=keras.optimizers.Adam(1e-3))
        before = [w.copy() for w in model.get_weights()]
        accumulate_gradients(model, steps, rdrop.forward)
        data = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=((spec, spec), spec))
        history = model.fit(data, epochs=1, steps_per_epoch=len(batches) // steps, shuffle=False, verbose=0).history
        assert history["rdrop_kl"][-1] > 1e-3, steps
        assert np.isfinite(history["loss"][-1])
        assert int(model.optimizer.iterations.numpy()) == len(batches) // steps
        assert any(np.any(a != b) for a, b in zip(before, model.get_weights()))


def test_alpha_zero_leaves_the_model_as_it_is_and_a_bad_alpha_or_loss_is_refused():
    import keras

    from keras_transformer import Transformer, TransformerConfig
    from keras_transformer.errors import ParameterError
    from keras_transformer.training import TrainingArgs
    from keras_transformer.training.rdrop import use_rdrop

    model = Transformer(TransformerConfig.tiny(vocab_size=VOCAB))
    model.compile()
    assert use_rdrop(model, 0.0) is None
    assert "train_step" not in vars(model)
    for bad in (-1.0, float("nan"), True, "5"):
        with pytest.raises(ValueError, match="rdrop_alpha"):
            use_rdrop(model, bad)
        with pytest.raises(ParameterError, match="rdrop_alpha"):
            TrainingArgs(rdrop_alpha=bad)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.raises(ValueError, match="model's loss is SparseCategoricalCrossentropy"):
        use_rdrop(model, ALPHA)


def test_the_command_line_sets_alpha():
    """`--rdrop-alpha` sets it, 0 by default; tests/test_run.py checks that a resume keeps it, and that a run
    recorded before the option resumes only with alpha 0."""
    import argparse

    from keras_transformer.cli.train import add_training_arguments, args_from_namespace

    parser = add_training_arguments(argparse.ArgumentParser())
    assert args_from_namespace(parser.parse_args(["--rdrop-alpha", "5"])).rdrop_alpha == 5.0
    assert args_from_namespace(parser.parse_args([])).rdrop_alpha == 0.0


def test_a_training_run_with_r_drop_logs_the_epochs_divergence(tmp_path, spm500):
    """`train` installs R-Drop and its metric: `history.csv` has the epoch's `rdrop_kl`, validation none."""
    from conftest import new_run_dir, read_csv

    from keras_transformer import training

    run_dir = new_run_dir(tmp_path / "run", spm500)
    options = dict(preset="tiny", vocab_size=500, batch_tokens=1024, max_length=32, warmup_steps=4, verbose=0)
    args = training.TrainingArgs(output=str(run_dir), max_steps=3, log_every=1, rdrop_alpha=ALPHA, **options)
    training.train(args)
    (row,) = read_csv(run_dir / "history.csv")
    assert float(row["rdrop_kl"]) > 1e-3 and "val_rdrop_kl" not in row and float(row["val_loss"]) > 0


def test_mirrored_strategy_gives_one_devices_update():
    """Two replicas, each doubling its half of every batch (halves of unequal token counts): the same first
    update and the same logged divergence as one device, without and with gradient accumulation."""
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
    for steps in ("1", "2"):
        assert result[steps]["update_difference"] < 1e-5 * result[steps]["update_scale"], result
        assert result[steps]["kl"] == pytest.approx(result[steps]["kl_one_device"], rel=1e-5)
        assert result[steps]["kl"] > 0.01


def _first_update(batches, steps, strategy=None):
    """The weight change of R-Drop's first SGD update (learning rate 1) over `steps` batches, and the logged
    divergence."""
    import tensorflow as tf

    from keras_transformer.training.accumulation import accumulate_gradients

    model, rdrop = _model(strategy=strategy)
    before = [w.copy() for w in model.get_weights()]
    accumulate_gradients(model, steps, rdrop.forward)
    spec = tf.TensorSpec([None, None], tf.int32)
    data = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=((spec, spec), spec))
    history = model.fit(data, epochs=1, steps_per_epoch=1, shuffle=False, verbose=0).history
    return [b - a for a, b in zip(model.get_weights(), before)], history["rdrop_kl"][-1]


def _mirrored_worker():
    """The script's `mirrored` mode (see the module docstring)."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    result = {"replicas": strategy.num_replicas_in_sync}
    for steps in (1, 2):
        batches = _batches(steps)
        update, kl = _first_update(batches, steps, strategy)
        reference, kl_one_device = _first_update(batches, steps)
        result[str(steps)] = {
            "update_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(update, reference)),
            "update_scale": max(float(np.max(np.abs(r))) for r in reference),
            "kl": kl,
            "kl_one_device": kl_one_device,
        }
    print(json.dumps(result))


if __name__ == "__main__" and sys.argv[1:] == ["mirrored"]:
    _mirrored_worker()
