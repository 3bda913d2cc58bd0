"""Config validation, the §5.3 schedule and the §5.4 loss, checked against their formulas."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import (
    LabelSmoothedCrossEntropy,
    MaskedAccuracy,
    TransformerConfig,
    TransformerSchedule,
    create_optimizer,
)


def test_presets_have_the_papers_values_and_take_overrides():
    base = TransformerConfig.base(37000)
    assert (base.num_layers, base.d_model, base.num_heads, base.d_ff, base.dropout) == (6, 512, 8, 2048, 0.1)
    assert (base.key_dim, base.value_dim, base.label_smoothing) == (64, 64, 0.1)
    big = TransformerConfig.big(37000)
    assert (big.num_layers, big.d_model, big.num_heads, big.d_ff, big.dropout) == (6, 1024, 16, 4096, 0.3)
    small = TransformerConfig.small()
    assert (small.num_layers, small.d_model, small.num_heads, small.d_ff) == (3, 256, 4, 1024)
    custom = TransformerConfig.base(vocab_size=37000, num_layers=2, d_ff=1024)
    assert (custom.num_layers, custom.d_ff, custom.d_model) == (2, 1024, 512)
    assert TransformerConfig.from_json(custom.to_json()) == custom
    assert not base.norm_first and base.share_embeddings and base.positional_encoding == "sinusoidal"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=500, num_heads=8), "not divisible by num_heads=8"),
        (dict(num_layers=0), "num_layers must be a positive integer"),
        (dict(d_ff=-1), "d_ff must be a positive integer"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(label_smoothing=-0.1), r"label_smoothing must be in \[0, 1\)"),
        (dict(positional_encoding="rotary"), "'sinusoidal' or 'learned'"),
        (dict(key_dim=0), "key_dim must be a positive integer"),
    ],
)
def test_config_validation(overrides, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.base(37000, **overrides)


def test_unknown_preset_and_field():
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        TransformerConfig.from_preset("huge", 100)
    with pytest.raises(ValueError, match="Unknown TransformerConfig field"):
        TransformerConfig.from_dict({"vocab_size": 100, "layers": 3})


def paper_rate(step_num, d_model=512, warmup=4000):
    return d_model**-0.5 * min(step_num**-0.5, step_num * warmup**-1.5)


@pytest.mark.parametrize("step_num", [1, 4000, 100000])
def test_schedule_equals_equation_3(step_num):
    schedule = TransformerSchedule(512, warmup_steps=4000)
    assert float(schedule.rate(step_num)) == pytest.approx(paper_rate(step_num), rel=1e-6)
    # Keras passes the number of updates already applied: update k uses step_num k + 1.
    assert float(schedule(step_num - 1)) == pytest.approx(paper_rate(step_num), rel=1e-6)


def test_schedule_serializes_and_optimizer_uses_paper_adam():
    schedule = TransformerSchedule(256, warmup_steps=100, scale=2.0)
    clone = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert float(clone(10)) == pytest.approx(float(schedule(10)))
    optimizer = create_optimizer(512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)


def test_fused_adam_matches_keras_adam_dense_and_sparse():
    """FusedAdam's one-kernel update is Keras' Adam; sparse gradients take Keras' path."""
    from keras_transformer.optimization import FusedAdam

    rng = np.random.default_rng(5)
    init = [rng.normal(size=(6, 3)).astype("float32"), rng.normal(size=(3,)).astype("float32")]
    steps = [[rng.normal(size=w.shape).astype("float32") for w in init] for _ in range(5)]
    results = []
    for optimizer_class in (keras.optimizers.Adam, FusedAdam):
        variables = [keras.Variable(w) for w in init]
        optimizer = optimizer_class(
            learning_rate=TransformerSchedule(8, warmup_steps=2), beta_1=0.9, beta_2=0.98, epsilon=1e-9
        )

        apply = _graph_update(optimizer, variables)
        for grads in steps:
            apply(tf.constant(grads[1]), tf.constant(grads[0][:2]))
        results.append([v.numpy() for v in variables])
        assert int(optimizer.iterations) == len(steps)
    for keras_value, fused_value, start in zip(*results, init):
        assert np.abs(keras_value - start).max() > 1e-3  # the updates did something
        np.testing.assert_allclose(fused_value, keras_value, rtol=1e-6, atol=1e-7)


def _graph_update(optimizer, variables):
    """A tf.function applying a sparse gradient (rows 0 and 4) to variables[0] and a dense one to variables[1]."""

    @tf.function
    def apply(dense, rows):
        sparse = tf.IndexedSlices(rows, tf.constant([0, 4]), tf.constant([6, 3]))
        optimizer.apply([sparse, dense], variables)

    return apply


def test_fused_adam_serializes_as_itself():
    optimizer = create_optimizer(64, warmup_steps=10, clipnorm=1.0)
    clone = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(clone).__name__ == "FusedAdam"
    assert (clone.beta_2, clone.epsilon, clone.clipnorm) == (0.98, 1e-9, 1.0)


def numpy_smoothed_loss(logits, labels, epsilon, pad=0):
    vocab = logits.shape[-1]
    log_p = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    q = np.full(logits.shape, epsilon / vocab)
    np.put_along_axis(q, labels[..., None], 1 - epsilon + epsilon / vocab, axis=-1)
    per_token = -(q * log_p).sum(-1)
    mask = labels != pad
    return (per_token * mask).sum() / mask.sum()


def test_label_smoothed_loss_equals_formula_and_ignores_padding():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 4, 7)).astype("float32")
    labels = np.array([[3, 1, 0, 0], [5, 6, 2, 0]])
    loss = LabelSmoothedCrossEntropy(0.1)
    assert float(loss(labels, logits)) == pytest.approx(numpy_smoothed_loss(logits, labels, 0.1), rel=1e-5)
    # Whatever sits at padded positions does not matter.
    changed = logits.copy()
    changed[labels == 0] = 100.0
    assert float(loss(labels, changed)) == pytest.approx(float(loss(labels, logits)), rel=1e-6)
    # epsilon = 0 is the ordinary cross-entropy.
    plain = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).numpy()
    assert float(LabelSmoothedCrossEntropy(0.0)(labels, logits)) == pytest.approx(plain[labels != 0].mean(), rel=1e-5)


def test_label_smoothed_gradient_is_softmax_minus_target():
    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(1, 3, 5)).astype("float32"))
    labels = np.array([[1, 4, 0]])
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = LabelSmoothedCrossEntropy(0.2)(labels, logits)
    grad = tape.gradient(value, logits).numpy()
    with tf.GradientTape() as tape:
        tape.watch(logits)
        log_p = tf.nn.log_softmax(logits)
        q = 0.8 * tf.one_hot(labels, 5) + 0.2 / 5
        reference = tf.reduce_sum(-tf.reduce_sum(q * log_p, -1) * (labels != 0)) / 2.0
    np.testing.assert_allclose(grad, tape.gradient(reference, logits).numpy(), atol=1e-6)
    assert np.all(grad[0, 2] == 0)


@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_xla_compiled_loss_equals_the_generic_one(epsilon):
    """The TF path (one XLA cluster) and the keras.ops path agree, value and gradient."""
    from keras_transformer import losses

    rng = np.random.default_rng(2)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32") * 3)
    labels = tf.constant([[1, 6, 0], [2, 2, 5]])
    upstream = tf.constant(rng.normal(size=(2, 3)).astype("float32"))
    results = []
    for fn in (losses._smoothed_token_loss_tf, losses._smoothed_token_loss_generic):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = fn(logits, labels, epsilon)
            weighted = tf.reduce_sum(value * upstream)
        results.append((value.numpy(), tape.gradient(weighted, logits).numpy()))
    np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[0][1], results[1][1], atol=1e-6)
    # bf16 logits: cast to float32 inside the compiled loss; the gradient comes back in bf16.
    half = tf.cast(logits, tf.bfloat16)
    with tf.GradientTape() as tape:
        tape.watch(half)
        value = losses._smoothed_token_loss_tf(half, labels, epsilon)
        weighted = tf.reduce_sum(value * upstream)
    gradient = tape.gradient(weighted, half)
    assert value.dtype == tf.float32 and gradient.dtype == tf.bfloat16
    expected = losses._smoothed_token_loss_generic(tf.cast(half, tf.float32), labels, epsilon)
    np.testing.assert_allclose(value.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tf.cast(gradient, tf.float32).numpy(), results[1][1], atol=2e-2)


def _loss_and_gradient(loss, labels, logits, sample_weight=None, upstream=1.0, mode="eager"):
    """The loss and the gradient of `upstream` x loss, with the tape inside the function (as in fit's step)."""

    def run(logits):
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits, sample_weight=sample_weight)
            scaled = value * upstream
        return value, tape.gradient(scaled, logits)

    if mode == "eager":
        return run(logits)
    return tf.function(run, jit_compile=mode == "xla")(logits)


MODES = ["eager", "graph", "xla"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("upstream", [1.0, 3.0], ids=["upstream 1", "upstream 3"])
@pytest.mark.parametrize("with_sample_weight", [False, True], ids=["", "sample weights"])
def test_loss_with_its_gradient_from_the_forward_pass_equals_the_per_token_formula(upstream, with_sample_weight, mode):
    """The TF path (value and gradient in one XLA pass, the gradient scaled by the upstream one, or not when
    it is 1; eagerly, in a graph and inside an XLA-compiled step) against the mean of the per-token losses
    of `call()` differentiated by autodiff."""
    rng = np.random.default_rng(3)
    logits = tf.constant(rng.normal(size=(2, 4, 9)).astype("float32") * 3)
    labels = tf.constant([[1, 8, 0, 0], [2, 2, 5, 3]])
    sample_weight = tf.constant([[1.0, 0.5, 1.0, 1.0], [2.0, 0.0, 1.0, 1.0]]) if with_sample_weight else None
    loss = LabelSmoothedCrossEntropy(0.1)
    value, gradient = _loss_and_gradient(loss, labels, logits, sample_weight, upstream, mode)
    weights = tf.cast(labels != 0, tf.float32) * (1.0 if sample_weight is None else sample_weight)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        reference = tf.reduce_sum(loss.call(labels, logits) * weights) / tf.reduce_sum(weights)
        scaled = reference * upstream
    np.testing.assert_allclose(value.numpy(), reference.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gradient.numpy(), tape.gradient(scaled, logits).numpy(), atol=1e-7)


def test_fit_computes_the_loss_gradient_ahead_and_evaluate_does_not(monkeypatch):
    from keras_transformer import losses

    calls = []
    one_pass = losses._weighted_loss_tf
    monkeypatch.setattr(losses, "_weighted_loss_tf", lambda *args: calls.append(1) or one_pass(*args))
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(7, 7)])  # ids -> logits
    model.compile(optimizer="sgd", loss=LabelSmoothedCrossEntropy(0.1))
    ids = np.array([[1, 6, 0], [2, 2, 5]])
    labels = np.array([[3, 1, 0], [5, 6, 2]])
    model.evaluate(ids, labels, verbose=0)
    assert calls == []
    before = model.get_weights()[0].copy()
    model.fit(ids, labels, epochs=1, verbose=0)
    assert calls == [1]  # traced once, under fit's tape
    assert not np.allclose(model.get_weights()[0], before)


def test_loss_computes_its_gradient_ahead_only_under_a_tape(monkeypatch):
    """A function traced under a tape takes the one-pass value-and-gradient path; one traced without does
    not, and gets the same value."""
    from keras_transformer import losses

    calls = []
    one_pass = losses._weighted_loss_tf
    monkeypatch.setattr(losses, "_weighted_loss_tf", lambda *args: calls.append(1) or one_pass(*args))
    rng = np.random.default_rng(6)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32"))
    labels = tf.constant([[1, 6, 0], [2, 2, 5]])
    loss = LabelSmoothedCrossEntropy(0.1)
    evaluated = float(tf.function(loss)(labels, logits))
    assert calls == []
    with tf.GradientTape() as tape:
        tape.watch(logits)
        trained = float(tf.function(loss)(labels, logits))
    assert calls == [1]
    assert evaluated == pytest.approx(trained, rel=1e-6)
    assert evaluated == pytest.approx(numpy_smoothed_loss(logits.numpy(), labels.numpy(), 0.1), rel=1e-5)


def test_loss_gradient_in_low_precision():
    """bf16 logits get a bf16 gradient (float32's within bf16 rounding); float16 logits keep the gradient in
    float32 until the upstream gradient (a loss scale) has scaled it, so it does not underflow."""
    rng = np.random.default_rng(4)
    # Logits that bf16 and float16 represent exactly, so every dtype differentiates the same function.
    logits = tf.cast(tf.cast(rng.normal(size=(8, 64, 50)).astype("float32") * 8, tf.bfloat16), tf.float32)
    labels = tf.constant(rng.integers(1, 50, size=(8, 64)))
    loss = LabelSmoothedCrossEntropy(0.0)  # no epsilon / V floor under the gradients: many are tiny
    scale = 2.0**15
    _, exact = _loss_and_gradient(loss, labels, logits, upstream=scale)
    exact = exact.numpy()
    _, half = _loss_and_gradient(loss, labels, tf.cast(logits, tf.bfloat16), upstream=scale)
    assert half.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(half, tf.float32).numpy(), exact, rtol=2**-8, atol=1e-30)
    _, half = _loss_and_gradient(loss, labels, tf.cast(logits, tf.float16), upstream=scale)
    assert half.dtype == tf.float16
    half = tf.cast(half, tf.float32).numpy()
    np.testing.assert_allclose(half, exact, rtol=2**-10, atol=6e-8)
    # Unscaled, these gradients would be below float16's smallest number (6e-8) and round to 0.
    tiny = np.abs(exact / scale) < 3e-8
    assert tiny.mean() > 0.1 and np.mean(half[tiny] != 0) > 0.5


def test_loss_and_its_gradient_ignore_non_finite_logits_at_padding():
    logits = np.random.default_rng(5).normal(size=(1, 3, 6)).astype("float32")
    logits[0, 2] = np.inf
    expected = numpy_smoothed_loss(logits[:, :2], np.array([[1, 4]]), 0.1)
    loss = LabelSmoothedCrossEntropy(0.1)
    logits = tf.constant(logits)
    labels = np.array([[1, 4, 0]])
    with tf.GradientTape() as tape:  # the one-pass path with its gradient
        tape.watch(logits)
        with_gradient = loss(labels, logits)
    gradient = tape.gradient(with_gradient, logits).numpy()
    assert float(with_gradient) == pytest.approx(expected, rel=1e-5)
    assert np.all(gradient[0, 2] == 0) and np.all(np.isfinite(gradient))
    # The value-only path, differentiated by autodiff (a function traced without a tape).
    value_only = tf.function(lambda logits: loss(labels, logits)).get_concrete_function(logits)
    with tf.GradientTape() as tape:
        tape.watch(logits)
        value = value_only(logits)
    assert float(value) == pytest.approx(expected, rel=1e-5)
    np.testing.assert_allclose(tape.gradient(value, logits).numpy(), gradient, atol=1e-7)


def test_masked_accuracy_counts_only_real_tokens():
    metric = MaskedAccuracy()
    logits = np.zeros((1, 4, 5), "float32")
    logits[0, 0, 2] = logits[0, 1, 3] = logits[0, 2, 1] = logits[0, 3, 4] = 1.0
    metric.update_state(np.array([[2, 3, 4, 0]]), logits)  # right, right, wrong, pad
    assert float(metric.result()) == pytest.approx(2 / 3)


@pytest.mark.parametrize("batch", [2, 3])  # 3: as many sentences as tokens, where [B] would broadcast over T
def test_masked_accuracy_takes_a_weight_per_sentence_as_the_loss_does(batch):
    logits = np.zeros((batch, 3, 5), "float32")
    labels = np.ones((batch, 3), "int32")
    logits[0, :, 1] = 1.0  # sentence 0 all right, the others all wrong
    per_sentence = np.zeros(batch, "float32")
    per_sentence[0] = 1.0
    metric = MaskedAccuracy()
    metric.update_state(labels, logits, sample_weight=per_sentence)
    assert float(metric.result()) == pytest.approx(1.0)
    per_token = MaskedAccuracy()
    per_token.update_state(labels, logits, sample_weight=np.repeat(per_sentence[:, None], 3, axis=1))
    assert float(per_token.result()) == pytest.approx(1.0)


def test_loss_refuses_a_reduction_it_would_ignore():
    with pytest.raises(ValueError, match="reduction='none' is not supported"):
        LabelSmoothedCrossEntropy(0.1, reduction="none")
    LabelSmoothedCrossEntropy(0.1, reduction="sum_over_batch_size")  # Keras' default: what it does
