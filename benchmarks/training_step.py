"""What two parts of our training step save: each undone in turn, timed against the step as it is.

* **The loss with its gradient in one pass.** `LabelSmoothedCrossEntropy`
  computes the batch's mean loss and its gradient `w * (softmax(z) - q)` in
  one XLA pass over the logits, under a gradient tape; without a tape (and
  in the "per-token loss" system) it sums `call()`'s per-token losses and
  autodiff runs a second pass over the logits for the gradient.
* **The feed-forward network on `[B*T, D]` rows.** A 2-D matmul lets
  TensorFlow's oneDNN rewrite fuse the bias and the ReLU into it; the
  "rank-3 feed-forward" system applies the two `Dense` layers to `[B, T, D]`
  as Keras does by default.

The small model in mixed_bfloat16 trained with `model.fit` on the workload
of `train_throughput.py` (64 pairs x 32 + 32 synthetic tokens, dropout and
label smoothing 0.1), one copy per system, built alike. Short runs of
`--steps` steps alternate between the systems for `--repeats` rounds; the
table gives median target tokens/s and the median over rounds of each run's
ratio to the run of our step in the same round (paired, so the machine's
drift cancels). A second table times the loss alone, forward and backward,
on `[64, 32, vocabulary]` bfloat16 logits.

Usage:

    .venv/bin/python benchmarks/training_step.py                        # ~8 min
    .venv/bin/python benchmarks/training_step.py --steps 2 --repeats 1   # a minute
    .venv/bin/python benchmarks/training_step.py --json benchmarks/results/<cpu>/training_step.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

import train_throughput  # noqa: E402

BASELINE = "ours"


@contextlib.contextmanager
def per_token_loss():
    """While a step is traced: the loss sums `call()`'s per-token losses, differentiated by autodiff."""
    from keras_transformer import compat

    saved = compat.gradient_may_be_recorded
    compat.gradient_may_be_recorded = lambda: False
    try:
        yield
    finally:
        compat.gradient_may_be_recorded = saved


@contextlib.contextmanager
def rank3_feed_forward():
    """While a step is traced: `FeedForward` applies its two `Dense` layers to `[B, T, D]` directly."""
    from keras_transformer.layers.feed_forward import FeedForward

    saved = FeedForward.call
    FeedForward.call = lambda self, inputs: self.outer(self.inner(inputs))
    try:
        yield
    finally:
        FeedForward.call = saved


def training_system(name, args, batches, undo=contextlib.nullcontext):
    """The small model in mixed_bfloat16 under `model.fit`, its step traced inside `undo()`."""

    def setup():
        import keras

        from keras_transformer import Transformer, TransformerConfig

        with common.policy_scope("mixed_bfloat16"), undo():
            keras.utils.set_random_seed(0)
            model = Transformer(TransformerConfig.from_preset("small", args.vocab_size, dropout=0.1))
            model.compile()
            train_throughput.keras_fit(model, train_throughput.keras_dataset(batches), args.warmup_steps)
        return train_throughput.keras_runner(model, batches, args.steps, "mixed_bfloat16")

    return common.System(name, setup, baseline=BASELINE)


def loss_rows(vocab_size, repeats=30):
    """Milliseconds (median of `repeats`) of the loss forward and backward, each way."""
    import tensorflow as tf

    from keras_transformer.losses import LabelSmoothedCrossEntropy

    logits = tf.cast(tf.random.stateless_normal([64, 32, vocab_size], seed=[0, 1]) * 2, tf.bfloat16)
    labels = tf.random.stateless_uniform([64, 32], seed=[0, 2], minval=1, maxval=vocab_size, dtype=tf.int32)
    loss = LabelSmoothedCrossEntropy(0.1)

    def step(undo):
        with undo():  # at trace time, like the training systems

            @tf.function
            def run(logits):
                with tf.GradientTape() as tape:
                    tape.watch(logits)
                    value = loss(labels, logits)
                return value, tape.gradient(value, logits)

            run(logits)
        return run

    rows = []
    for name, undo in (("one pass", contextlib.nullcontext), ("per-token loss, autodiff", per_token_loss)):
        run = step(undo)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            _, gradient = run(logits)
            gradient.numpy()
            seconds.append(time.perf_counter() - started)
        rows.append({"loss": name, "ms": round(1e3 * common.median(seconds), 2)})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per timed run")
    parser.add_argument("--repeats", type=int, default=12, help="alternated rounds")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    machine = common.machine_info()

    batches = train_throughput.make_batches(8, 64, 32, 32, args.vocab_size, "none")
    systems = [
        training_system(BASELINE, args, batches),
        training_system("per-token loss", args, batches, per_token_loss),
        training_system("rank-3 feed-forward", args, batches, rank3_feed_forward),
    ]
    results = common.run_alternating(systems, args.repeats)
    ratios = common.paired_ratios(results, BASELINE)
    print(
        common.markdown_table(
            ["training (small, mixed_bfloat16)", "target tokens/s (median)", "paired ratio to ours"],
            [(r.name, common.fmt(r.median_rate("tokens")), common.fmt(ratios[r.name], ".3f")) for r in results],
        )
    )
    losses = loss_rows(args.vocab_size)
    print()
    print(
        common.markdown_table(
            [f"loss fwd+bwd, [64, 32, {args.vocab_size}] bf16 logits", "ms (median)"],
            [(row["loss"], row["ms"]) for row in losses],
        )
    )
    common.write_json(
        args.json,
        {
            "benchmark": "training_step",
            "args": vars(args),
            "machine": {**machine, "load_average_at_end": common.load_average()},
            "versions": common.package_versions(["tensorflow", "keras"]),
            "results": common.results_payload(results, ["tokens"]),
            "paired_ratio_to_ours": ratios,
            "loss_forward_backward": losses,
        },
    )


if __name__ == "__main__":
    main()
