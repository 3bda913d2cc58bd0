"""Dropout: the rate each implementation really drops, and what it costs a training step.

Two measurements, Keras' `keras.layers.Dropout` against ours
(`keras_transformer.layers.Dropout`, random integers compared with the rate):

* **Rate.** Each layer, at rate `--rate`, drops elements of a [1024, 4096]
  tensor of ones under the float32 and the mixed_bfloat16 dtype policy
  (the layer computes in bfloat16; three seeds each); the table
  gives the dropped share and the output's mean (the expectation dropout
  must keep: 1). Keras draws its uniform numbers in the input's dtype, 8
  significant bits in bfloat16.
* **Speed.** The small model in mixed_bfloat16 trained with `model.fit` on
  the workload of `train_throughput.py` (64 pairs x 32 + 32 synthetic
  tokens), three copies built alike: every dropout Keras', every dropout
  ours, and dropout 0 (the bound). Short runs of `--steps` steps alternate
  between the three for `--repeats` rounds; the table gives median target
  tokens/s and the median over rounds of each run's ratio to the Keras run
  of the same round (paired, so the machine's drift cancels).

Usage:

    .venv/bin/python benchmarks/dropout.py                       # ~8 min
    .venv/bin/python benchmarks/dropout.py --steps 2 --repeats 1  # seconds
    .venv/bin/python benchmarks/dropout.py --json benchmarks/results/<cpu>/dropout.json
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

import numpy as np  # noqa: E402
import train_throughput  # noqa: E402


def rate_rows(rate, seeds=(0, 1, 2)):
    """`[{implementation, dtype, dropped_share, output_mean}]`, averaged over `seeds`."""
    import keras
    import tensorflow as tf

    from keras_transformer.layers import Dropout

    rows = []
    for name, layer_class in (("keras", keras.layers.Dropout), ("ours", Dropout)):
        for policy in ("float32", "mixed_bfloat16"):
            shares, means = [], []
            for seed in seeds:
                layer = layer_class(rate, seed=seed, dtype=policy)
                y = layer(tf.ones((1024, 4096), layer.compute_dtype), training=True)
                y = np.asarray(tf.cast(y, tf.float32))
                shares.append(float(np.mean(y == 0.0)))
                means.append(float(np.mean(y, dtype=np.float64)))
            rows.append(
                {
                    "implementation": name,
                    "dtype_policy": policy,
                    "rate": rate,
                    "dropped_share": float(np.mean(shares)),
                    "output_mean": float(np.mean(means)),
                }
            )
    return rows


def _with_keras_dropout(model):
    """Makes every dropout layer of a built `model` run Keras' own dropout."""
    import keras

    from keras_transformer.layers import Dropout

    class KerasDropout(Dropout):
        call = keras.layers.Dropout.call

    swapped = 0
    for layer in model._flatten_layers():
        if type(layer) is Dropout:
            layer.__class__ = KerasDropout
            swapped += 1
    return swapped


def training_system(name, args, batches, dropout, keras_dropout=False):
    """The small model in mixed_bfloat16 under `model.fit`, its dropouts ours or (`keras_dropout`) Keras'."""
    info = {"dropout": dropout}

    def setup():
        import keras

        from keras_transformer import Transformer, TransformerConfig

        with common.policy_scope("mixed_bfloat16"):
            keras.utils.set_random_seed(0)
            model = Transformer(TransformerConfig.from_preset("small", args.vocab_size, dropout=dropout))
            source, target_in, _ = batches[0]
            model((source, target_in))  # builds every sublayer before the swap
            if keras_dropout:
                info["dropout_layers_swapped"] = _with_keras_dropout(model)
            model.compile()
            train_throughput.keras_fit(model, train_throughput.keras_dataset(batches), args.warmup_steps)
        return train_throughput.keras_runner(model, batches, args.steps, "mixed_bfloat16")

    return common.System(name, setup, baseline="keras dropout", info=info)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=10, help="training steps per timed run")
    parser.add_argument("--repeats", type=int, default=20, help="alternated rounds")
    parser.add_argument("--warmup-steps", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    machine = common.machine_info()

    rates = rate_rows(args.rate)
    print(
        common.markdown_table(
            ["implementation", "dtype policy", f"dropped at rate {args.rate}", "output mean (1 expected)"],
            [
                (r["implementation"], r["dtype_policy"], f"{100 * r['dropped_share']:.3f}%", f"{r['output_mean']:.5f}")
                for r in rates
            ],
        )
    )

    batches = train_throughput.make_batches(8, 64, 32, 32, args.vocab_size, "none")
    systems = [
        training_system("keras dropout", args, batches, args.rate, keras_dropout=True),
        training_system("ours", args, batches, args.rate),
        training_system("dropout 0", args, batches, 0.0),
    ]
    results = common.run_alternating(systems, args.repeats)
    ratios = common.paired_ratios(results, "keras dropout")
    print()
    print(
        common.markdown_table(
            ["training (small, mixed_bfloat16)", "target tokens/s (median)", "paired ratio to Keras' dropout"],
            [(r.name, common.fmt(r.median_rate("tokens")), common.fmt(ratios[r.name], ".3f")) for r in results],
        )
    )
    common.write_json(
        args.json,
        {
            "benchmark": "dropout",
            "args": vars(args),
            "machine": {**machine, "load_average_at_end": common.load_average()},
            "versions": common.package_versions(["tensorflow", "keras"]),
            "rates": rates,
            "results": common.results_payload(results, ["tokens"]),
            "paired_ratio_to_keras_dropout": ratios,
        },
    )


if __name__ == "__main__":
    main()
