"""Input-pipeline benchmark: throughput and padding, with and without bucketing.

Runs ``keras_transformer.data.make_batches`` over Multi30k train (29,000 pairs,
en->de) and reports, per pipeline variant:

* throughput: sentence pairs per second, tokenized + bucketed + batched + padded
  (fastest of ``--epochs`` full epochs after one warm-up epoch; the consumer
  does nothing, so this is the most the pipeline can feed a model);
* padding ratio: pad tokens / all tokens in the batches (source + target);
* largest batch in tokens (one side, padding included) and number of distinct
  batch shapes (fewer shapes -> fewer retraces / recompilations).

Variants:

* ``bucketed``: the default -- geometric bucket boundaries, multiples of 8
  (``default_bucket_boundaries``), token-budget batches (§5.1 of the paper).
* ``bucketed, step 1``: boundaries one or two tokens apart for short
  sentences (``multiple=1``, ``train --pad-to-multiple-of 1``): less padding,
  more shapes.
* ``one bucket``: a single boundary = max_length: every batch padded to
  max_length (what "no bucketing" means with fixed shapes).
* ``no bucketing``: shuffled pairs, a fixed number of sentences per batch
  (the average batch size of the bucketed run), padded to the longest pair in
  the batch -- the usual naive pipeline.

Usage::

    .venv/bin/python benchmarks/input_pipeline.py [--batch-tokens 4096] [--tokenizer spm.model] [--json PATH]

Without ``--tokenizer`` it first trains the joint BPE vocabulary on Multi30k
train (en + de) and reports how long that took.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import data  # noqa: E402
from keras_transformer.data import corpora  # noqa: E402
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer  # noqa: E402


def naive_batches(dataset, tokenizer, batch_size, max_length, seed=0):
    """Shuffled fixed-size batches padded to their longest pair (no bucketing)."""
    dataset = dataset.shuffle(int(dataset.cardinality()), seed=seed)

    def tokenize(sources, targets):
        src, tgt = tokenizer.tokenize(sources), tokenizer.tokenize(targets)
        n = tf.shape(sources, out_type=tf.int64)[0]
        eos = tf.fill([n, 1], EOS_ID)
        bos = tf.fill([n, 1], BOS_ID)
        src, tgt_in, tgt_out = tf.concat([src, eos], 1), tf.concat([bos, tgt], 1), tf.concat([tgt, eos], 1)
        fits = (src.row_lengths() <= max_length) & (tgt_in.row_lengths() <= max_length)
        return tuple(tf.ragged.boolean_mask(x, fits) for x in (src, tgt_in, tgt_out))

    dataset = dataset.batch(1024).map(tokenize, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    def pad_to_longest(src, tgt_in, tgt_out):
        # One length for both sides, as in make_batches.
        length = tf.maximum(src.bounding_shape(1), tgt_in.bounding_shape(1))
        shape = tf.stack([src.nrows(), length])
        src, tgt_in, tgt_out = (x.to_tensor(default_value=PAD_ID, shape=shape) for x in (src, tgt_in, tgt_out))
        return (src, tgt_in), tgt_out

    dataset = dataset.ragged_batch(batch_size).map(pad_to_longest, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def time_epoch(batches):
    """(wall seconds, CPU seconds of this process, all threads) for one epoch."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in batches:
        pass
    return time.perf_counter() - start, time.process_time() - start_cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--tokenizer", help="existing spm.model (default: train one)")
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs (after 1 warm-up)")
    parser.add_argument("--json", default=None, help="write the rows to this JSON file")
    args = parser.parse_args(argv)

    machine = common.machine_info()  # the load average before the pipelines run
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPU cores")
    if args.tokenizer:
        tokenizer = Tokenizer(args.tokenizer)
    else:
        texts = corpora.read_lines("train", "en") + corpora.read_lines("train", "de")
        with tempfile.TemporaryDirectory() as tmp:
            start = time.perf_counter()
            tokenizer = train_tokenizer(texts, os.path.join(tmp, "spm"), vocab_size=args.vocab_size)
            elapsed = time.perf_counter() - start
        print(
            f"Vocabulary: joint BPE, {tokenizer.vocab_size} ids, trained on {len(texts)} lines "
            f"(Multi30k train en+de) in {elapsed:.2f} s"
        )

    train = corpora.load_multi30k("train", "en", "de")
    options = dict(batch_tokens=args.batch_tokens, max_length=args.max_length, num_replicas=1)
    fine = data.default_bucket_boundaries(args.max_length, multiple=1)
    variants = [
        ("bucketed (default, x8)", lambda: data.make_batches(train, tokenizer, **options)),
        ("bucketed, step 1", lambda: data.make_batches(train, tokenizer, bucket_boundaries=fine, **options)),
        (
            "one bucket (max_length)",
            lambda: data.make_batches(train, tokenizer, bucket_boundaries=[args.max_length], **options),
        ),
    ]

    rows = []
    for name, build in variants:
        rows.append(measure(name, build(), args.epochs))
    # Naive pipeline with the same average number of sentences per batch.
    mean_batch = max(1, round(rows[0]["num_examples"] / rows[0]["num_batches"]))
    rows.append(
        measure(
            f"no bucketing ({mean_batch}/batch)",
            naive_batches(train, tokenizer, mean_batch, args.max_length),
            args.epochs,
        )
    )

    print(
        f"\nMulti30k train, batch_tokens={args.batch_tokens}, max_length={args.max_length}, "
        f"1 warm-up + {args.epochs} timed epoch(s)\n"
    )
    header = (
        "pipeline",
        "pairs/s",
        "pairs/CPU-s",
        "tokens/s",
        "batches",
        "pairs",
        "padding",
        "real target share",
        "max batch tok",
        "shapes",
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|")
    for r in rows:
        print(
            f"| {r['name']} | {r['pairs_per_s']:,.0f} | {r['pairs_per_cpu_s']:,.0f} | "
            f"{r['tokens_per_s']:,.0f} | {r['num_batches']} | "
            f"{r['num_examples']} | {r['padding_ratio']:.1%} | {r['target_real_share']:.1%} | "
            f"{r['max_batch_tokens']} | {len(r['shapes'])} |"
        )
    print(
        "\npadding = pad tokens / all tokens (source + target input); tokens/s = real (non-pad) "
        "source + target tokens per second; pairs/CPU-s = pairs per second of CPU time used by "
        "all pipeline threads (less sensitive to other load on the machine); real target share = "
        "real target tokens / target positions, the share of a training step's decoder work that is not padding."
    )
    for r in rows:
        r["num_shapes"] = len(r.pop("shapes"))
    common.write_json(
        args.json,
        {
            "benchmark": "input_pipeline",
            "batch_tokens": args.batch_tokens,
            "max_length": args.max_length,
            "epochs": args.epochs,
            "rows": rows,
            "machine": machine,
            "versions": common.package_versions(
                ["keras-transformer", "tensorflow", "tensorflow-text", "sentencepiece"]
            ),
        },
    )


def measure(name, batches, epochs):
    stats = data.token_budget_stats(batches)  # warm-up epoch, also counts tokens
    seconds, cpu_seconds = min(time_epoch(batches) for _ in range(epochs))
    stats.update(
        name=name,
        target_real_share=stats["target_tokens"] / max(stats["padded_tokens"] / 2, 1),
        pairs_per_s=stats["num_examples"] / seconds,
        pairs_per_cpu_s=stats["num_examples"] / cpu_seconds,
        tokens_per_s=(stats["source_tokens"] + stats["target_tokens"]) / seconds,
    )
    print(f"  {name}: {seconds:.2f} s/epoch ({cpu_seconds:.2f} CPU-s)", flush=True)
    return stats


if __name__ == "__main__":
    main()
