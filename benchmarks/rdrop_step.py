"""What an R-Drop update costs (`--rdrop-alpha`), and what its fused divergence saves.

Three training systems, the `mini` model (the Multi30k recipes' shape) in
mixed_bfloat16 with dropout 0.3 under `model.fit`, on the synthetic batches
of `train_throughput.py` (32 + 32 tokens per pair):

* **plain**: the paper's loss on batches of `--batch-size` pairs;
* **R-Drop**: alpha 5 on batches of half as many pairs, each run twice (the
  recipe's advice: halve `--batch-tokens` to keep an update's cost);
* **R-Drop, divergence by autodiff**: the same, with the divergence written
  op by op and differentiated by TensorFlow instead of `kernels.divergence`.

Short runs of `--steps` updates alternate between the systems for
`--repeats` rounds. The table gives each system's median updates per second
and the median over rounds of its ratio to the plain run of the same round
(paired, so the machine's drift cancels). A second table times the
divergence alone, forward and backward, on the logits of `--batch-size`
pairs (both passes) in bfloat16, each way, beside the label-smoothed loss
on the same logits.

Usage:

    .venv/bin/python benchmarks/rdrop_step.py                        # ~5 min
    .venv/bin/python benchmarks/rdrop_step.py --steps 2 --repeats 1   # a minute
    .venv/bin/python benchmarks/rdrop_step.py --json benchmarks/results/<cpu>/rdrop_step.json
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

BASELINE = "plain"
ALPHA = 5.0


@contextlib.contextmanager
def divergence_by_autodiff():
    """While a step is traced: R-Drop's divergence is `symmetric_kl` summed op by op, differentiated by autodiff."""
    from keras import ops

    from keras_transformer.kernels import divergence
    from keras_transformer.training.rdrop import symmetric_kl

    saved = divergence.weighted_divergence_with_gradient
    divergence.weighted_divergence_with_gradient = lambda logits, weights: ops.sum(
        symmetric_kl(*ops.split(logits, 2, axis=0)) * weights
    )
    try:
        yield
    finally:
        divergence.weighted_divergence_with_gradient = saved


def training_system(name, args, batches, alpha=0.0, undo=contextlib.nullcontext):
    """The mini model in mixed_bfloat16 under `model.fit`, with R-Drop at `alpha`, its step traced inside
    `undo()`; a run reports its updates."""

    def setup():
        import keras

        from keras_transformer import Transformer, TransformerConfig
        from keras_transformer.training.rdrop import use_rdrop

        with common.policy_scope("mixed_bfloat16"), undo():
            keras.utils.set_random_seed(0)
            model = Transformer(TransformerConfig.from_preset("mini", args.vocab_size, dropout=0.3))
            model.compile()
            use_rdrop(model, alpha)
            train_throughput.keras_fit(model, train_throughput.keras_dataset(batches), args.warmup_steps)
        dataset = train_throughput.keras_dataset(batches)

        def run():
            with common.policy_scope("mixed_bfloat16"), undo():
                train_throughput.keras_fit(model, dataset, args.steps)
            return {"updates": args.steps}

        return run

    return common.System(name, setup, baseline=BASELINE)


def divergence_rows(batch_size, vocab_size, repeats=20):
    """Milliseconds (median of `repeats`) of the divergence forward and backward, fused and by autodiff, and of
    the label-smoothed loss on the same logits."""
    import tensorflow as tf

    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.training.rdrop import mean_symmetric_kl

    logits = tf.cast(tf.random.stateless_normal([batch_size, 32, vocab_size], seed=[0, 1]) * 2, tf.bfloat16)
    labels = tf.random.stateless_uniform([batch_size // 2, 32], seed=[0, 2], minval=1, maxval=vocab_size)
    labels = tf.cast(labels, tf.int32)
    loss = LabelSmoothedCrossEntropy(0.1)
    computations = (
        ("divergence, one pass", lambda z: mean_symmetric_kl(z, labels, 0), contextlib.nullcontext),
        ("divergence, autodiff", lambda z: mean_symmetric_kl(z, labels, 0), divergence_by_autodiff),
        (
            "label-smoothed loss, for scale",
            lambda z: loss(tf.concat([labels, labels], 0), z),
            contextlib.nullcontext,
        ),
    )
    rows = []
    for name, value_of, undo in computations:
        with undo():  # at trace time, like the training systems

            @tf.function
            def run(logits, value_of=value_of):
                with tf.GradientTape() as tape:
                    tape.watch(logits)
                    value = value_of(logits)
                return value, tape.gradient(value, logits)

            run(logits)
        seconds = []
        for _ in range(repeats):
            started = time.perf_counter()
            _, gradient = run(logits)
            gradient.numpy()
            seconds.append(time.perf_counter() - started)
        rows.append({"computation": name, "ms": round(1e3 * common.median(seconds), 2)})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="updates per timed run")
    parser.add_argument("--repeats", type=int, default=6, help="alternated rounds")
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=128, help="pairs per plain batch (even)")
    parser.add_argument("--vocab-size", type=int, default=9713, help="the published recipe's joint vocabulary")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    machine = common.machine_info()

    full = train_throughput.make_batches(8, args.batch_size, 32, 32, args.vocab_size, "random")
    half = train_throughput.make_batches(8, args.batch_size // 2, 32, 32, args.vocab_size, "random")
    systems = [
        training_system(BASELINE, args, full),
        training_system("R-Drop, half batch", args, half, ALPHA),
        training_system("R-Drop, half batch, divergence by autodiff", args, half, ALPHA, divergence_by_autodiff),
    ]
    results = common.run_alternating(systems, args.repeats)
    ratios = common.paired_ratios(results, BASELINE, "updates")
    print(
        common.markdown_table(
            ["training (mini, mixed_bfloat16, dropout 0.3)", "updates/s (median)", "paired ratio to plain"],
            [(r.name, common.fmt(r.median_rate("updates"), ".3f"), common.fmt(ratios[r.name], ".3f")) for r in results],
        )
    )
    divergences = divergence_rows(args.batch_size, args.vocab_size)
    print()
    print(
        common.markdown_table(
            [f"fwd+bwd, [{args.batch_size}, 32, {args.vocab_size}] bf16 logits", "ms (median)"],
            [(row["computation"], row["ms"]) for row in divergences],
        )
    )
    common.write_json(
        args.json,
        {
            "benchmark": "rdrop_step",
            "args": vars(args),
            "machine": {**machine, "load_average_at_end": common.load_average()},
            "versions": common.package_versions(["tensorflow", "keras"]),
            "results": common.results_payload(results, ["updates"]),
            "paired_ratio_to_plain": ratios,
            "divergence_forward_backward": divergences,
        },
    )


if __name__ == "__main__":
    main()
