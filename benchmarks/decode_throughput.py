"""Decoding throughput: our beam search against keras-hub's BeamSampler and CTranslate2, one process.

Workload: the small shape (3+3 layers, d_model 256, 4 heads, d_ff 1024, shared
vocabulary 8000) with random weights; `--sentences` (1000) source sentences
of 8 to 24 random tokens, sorted by length and cut into batches of 32 (the
TensorFlow systems get each batch padded to a multiple of 8 tokens, which
bounds the number of shapes XLA compiles); beam size 4; every system
generates exactly 20 tokens per sentence (min = max length = 20: with random
weights nothing else makes the amounts of work equal).

Systems:

* ours: `keras_transformer.decoding.make_decode_fn(model, "beam",
  jit_compile=..., beam_size=4, alpha=0.6, max_length=20, min_length=20)`,
  the cached beam search as one TF graph: float32 ("ours fp32"), float32 with
  XLA ("ours fp32 XLA"), and a copy of the same weights under the
  `bfloat16` policy, weights stored in bfloat16 as `export --precision
  bfloat16` stores them ("ours bf16", "ours bf16 XLA"). "x2": two batches
  decoded at once from two Python threads.
* keras-hub: `keras_hub.samplers.BeamSampler(num_beams=4)` driving a cached
  decoder built from `TokenAndPositionEmbedding` + `TransformerEncoder` /
  `TransformerDecoder` (the same shape; its own random weights), the way
  keras-hub's seq2seq models (BART) generate: self- and cross-attention
  caches, one token per step; in a `tf.function`, without and with XLA.
  BeamSampler has no length penalty and no minimum length; with no stop
  token it runs exactly 20 steps.
  `--tf-threads 1,2` gives TensorFlow one thread per op and two ops at
  a time, for every TensorFlow row: each of the x2 rows' batches then has a
  core, as each of CTranslate2's `inter_threads` has.
* CTranslate2: OUR weights converted with
  `keras_transformer.inference.ctranslate2.export_ctranslate2` (float32, and
  int8 weights), `Translator(device="cpu", intra_threads=2)` (the x2 rows:
  `inter_threads=2, intra_threads=1`),
  `translate_batch(..., beam_size=4, min_decoding_length=20,
  max_decoding_length=20, max_batch_size=32)`. Before timing, the
  conversion is checked: CTranslate2's float32 greedy outputs must equal
  ours on a few sentences (int8's agreement is recorded, not required).

Every system is warmed up (each batch shape traced / compiled once), then
timed passes over all sentences alternate between systems for `--repeats`
rounds; the table gives medians of generated tokens per second (tokens of
the best hypothesis, start token excluded) and sentences per second.

Usage:

    .venv/bin/python benchmarks/decode_throughput.py                     # full: several minutes
    .venv/bin/python benchmarks/decode_throughput.py --sentences 64 --repeats 1   # quick
    .venv/bin/python benchmarks/decode_throughput.py --only ours --json out/decode.json --plot out/decode.png
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

import numpy as np  # noqa: E402

PAD, BOS, EOS = 0, 2, 3


# Workload ----------------------------------------------------------------------------


def make_sentences(count, min_length, max_length, vocab_size, seed=0):
    """`count` random source sentences (lists of ids in [4, vocab)), sorted by length."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_length, max_length + 1, size=count)
    sentences = [[int(t) for t in rng.integers(4, vocab_size, size=n)] for n in lengths]
    return sorted(sentences, key=len)


def make_batches(sentences, batch_size, multiple):
    """Consecutive batches of `batch_size` sentences, each padded to a multiple of `multiple` tokens."""
    batches = []
    for start in range(0, len(sentences), batch_size):
        chunk = sentences[start : start + batch_size]
        width = -(-max(len(s) for s in chunk) // multiple) * multiple
        batches.append(np.array([s + [PAD] * (width - len(s)) for s in chunk], np.int32))
    return batches


def distinct_shapes(batches):
    """One batch per distinct shape (what a warm-up must run to trace / compile everything)."""
    seen = {}
    for batch in batches:
        seen.setdefault(batch.shape, batch)
    return list(seen.values())


# Ours --------------------------------------------------------------------------------


class OurModels:
    """Builds our float32 model once (seeded) and copies of its weights under other dtype policies on demand."""

    def __init__(self, args):
        self.args = args
        self._models = {}

    def get(self, policy):
        if policy not in self._models:
            import keras

            from keras_transformer import Transformer, TransformerConfig

            if policy != "float32":
                source = self.get("float32")
            keras.utils.set_random_seed(0)
            with common.policy_scope(policy):
                model = Transformer(TransformerConfig.small(self.args.vocab_size))
                model.build()
            if policy != "float32":
                model.set_weights(source.get_weights())
            self._models[policy] = model
        return self._models[policy]


def ours_system(args, models, batches, policy, jit, name, baseline, workers=1):
    """`workers > 1`: that many batches decoded at once from Python threads (like a server's concurrent requests)."""

    def setup():
        from keras_transformer.decoding import make_decode_fn

        with common.policy_scope(policy):
            model = models.get(policy)
            decode = make_decode_fn(
                model,
                "beam",
                jit_compile=jit,
                beam_size=args.beam_size,
                alpha=0.6,
                max_length=args.output_length,
                min_length=args.output_length,
            )
            for batch in distinct_shapes(batches):
                decode(batch)

        def decode_batch(batch):
            token_ids, _ = decode(batch)
            return int(np.count_nonzero(token_ids.numpy())), batch.shape[0]

        def run():
            with common.policy_scope(policy):
                if workers == 1:
                    counts = [decode_batch(batch) for batch in batches]
                else:
                    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
                        counts = list(pool.map(decode_batch, batches))
            return {"tokens": sum(t for t, _ in counts), "sentences": sum(n for _, n in counts)}

        return run

    return common.System(
        name,
        setup,
        baseline=baseline,
        info={
            "policy": policy,
            "jit_compile": jit,
            "concurrent_batches": workers,
            "api": "make_decode_fn(model, 'beam', ...)",
        },
    )


# keras-hub ---------------------------------------------------------------------------


def keras_hub_generate_fn(model, beam_size, output_length, jit):
    """A tf.function: source ids [B, S] -> [B, 1 + output_length] (start token + best beam)."""
    import keras_hub
    import tensorflow as tf
    from keras import ops

    sampler = keras_hub.samplers.BeamSampler(num_beams=beam_size)
    num_layers, num_heads = model.num_layers, model.num_heads
    head_dim = model.d_model // num_heads
    total_length = 1 + output_length

    def call_decoder_with_cache(tokens, memory, source_mask, self_cache, self_index, cross_cache, cross_index):
        # As keras_hub's BartSeq2SeqLM.call_decoder_with_cache.
        y = model.embedding(tokens, start_index=self_index)
        self_caches, cross_caches = [], []
        for i, layer in enumerate(model.decoder_layers):
            y, next_self, next_cross = layer(
                y,
                memory,
                encoder_padding_mask=source_mask,
                self_attention_cache=self_cache[:, i, ...],
                self_attention_cache_update_index=self_index,
                cross_attention_cache=cross_cache[:, i, ...],
                cross_attention_cache_update_index=cross_index,
            )
            self_caches.append(next_self)
            cross_caches.append(next_cross)
        self_cache = ops.stack(self_caches, axis=1)
        if cross_index is not None:
            cross_cache = ops.stack(cross_caches, axis=1)
        return model.logits(y), self_cache, cross_cache

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)], jit_compile=jit)
    def generate(source_ids):
        batch_size, source_length = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
        source_mask = tf.not_equal(source_ids, PAD)
        memory = model.encode(source_ids, training=False)
        prompt = tf.concat([tf.fill([batch_size, 1], BOS), tf.zeros([batch_size, output_length], tf.int32)], 1)
        prompt_mask = tf.concat([tf.ones([batch_size, 1], tf.bool), tf.zeros([batch_size, output_length], tf.bool)], 1)
        dtype = model.compute_dtype
        self_cache = tf.zeros([batch_size, num_layers, 2, total_length, num_heads, head_dim], dtype)
        cross_cache = tf.zeros([batch_size, num_layers, 2, source_length, num_heads, head_dim], dtype)
        # Seed the caches with the start token (cross-attention keys/values computed once).
        _, self_cache, cross_cache = call_decoder_with_cache(
            prompt[:, :1], memory, source_mask, self_cache, 0, cross_cache, 0
        )

        def next(prompt, cache, index):
            self_cache, memory, source_mask, cross_cache = cache
            cache_index = index - 1
            tokens = ops.slice(prompt, [0, cache_index], [ops.shape(prompt)[0], 1])
            logits, self_cache, _ = call_decoder_with_cache(
                tokens, memory, source_mask, self_cache, cache_index, cross_cache, None
            )
            return logits[:, 0, :], None, (self_cache, memory, source_mask, cross_cache)

        return sampler(
            next=next,
            prompt=prompt,
            cache=(self_cache, memory, source_mask, cross_cache),
            index=1,
            mask=prompt_mask,
            stop_token_ids=None,
            model=model,
        )

    return generate


def keras_hub_system(args, batches, jit, name, baseline):
    def setup():
        try:
            import keras_hub  # noqa: F401
        except ImportError:
            raise common.Skip("keras-hub is not installed (pip install -e '.[bench]')") from None
        import keras
        from train_throughput import SHAPES, KerasHubSeq2Seq

        keras.utils.set_random_seed(0)
        with common.policy_scope("float32"):
            model = KerasHubSeq2Seq.build(args.vocab_size, 256, dropout=0.1, **SHAPES["small"])
            model((np.ones((1, 4), np.int32), np.ones((1, 3), np.int32)))
            generate = keras_hub_generate_fn(model, args.beam_size, args.output_length, jit)
            for batch in distinct_shapes(batches):
                output = generate(batch).numpy()
        assert output.shape[1] == 1 + args.output_length, output.shape

        def run():
            tokens = sentences = 0
            for batch in batches:
                output = generate(batch).numpy()
                tokens += int(np.count_nonzero(output[:, 1:]))
                sentences += batch.shape[0]
            return {"tokens": tokens, "sentences": sentences}

        return run

    return common.System(
        name, setup, baseline=baseline, info={"jit_compile": jit, "sampler": "keras_hub.samplers.BeamSampler"}
    )


# CTranslate2 -------------------------------------------------------------------------


def check_conversion(args, model, translator, vocabulary, count=8):
    """CTranslate2 greedy == our greedy on `count` sentences: returns the number that agree."""
    from keras_transformer.decoding import greedy_search

    sentences = make_sentences(count, 8, 24, args.vocab_size, seed=1)
    width = max(len(s) for s in sentences)
    padded = np.array([s + [PAD] * (width - len(s)) for s in sentences], np.int32)
    # CTranslate2 never outputs an empty hypothesis (min_decoding_length defaults to 1).
    ours, _ = greedy_search(model, padded, max_length=args.output_length, min_length=1)
    theirs = translator.translate_batch(
        [[vocabulary[i] for i in s] for s in sentences],
        beam_size=1,
        max_decoding_length=args.output_length,
        suppress_sequences=[["<pad>"]],
    )
    agree = 0
    for row, result in zip(ours.numpy(), theirs):
        ids = [int(i) for i in row if i != PAD]
        ids = ids[: ids.index(EOS)] if EOS in ids else ids
        agree += [vocabulary[i] for i in ids] == result.hypotheses[0]
    return agree, count


def ctranslate2_system(args, models, sentences, quantization, name, baseline, workdir, workers=1):
    """`workers > 1`: CTranslate2's `inter_threads` (batches in parallel), cores shared among them."""
    intra_threads = max(1, args.threads // workers)
    info = {"quantization": quantization or "float32", "inter_threads": workers, "intra_threads": intra_threads}

    def setup():
        try:
            import ctranslate2
        except ImportError:
            raise common.Skip("ctranslate2 is not installed (pip install -e '.[bench]')") from None
        from keras_transformer.inference.ctranslate2 import default_vocabulary, export_ctranslate2

        model = models.get("float32")
        path = os.path.join(workdir, f"ct2_{quantization or 'float32'}")
        # The sentences carry no end token: tell CTranslate2 not to add one either.
        export_ctranslate2(model, path, quantization=quantization, add_source_eos=False)
        translator = ctranslate2.Translator(
            path,
            device="cpu",
            compute_type=quantization or "float32",
            inter_threads=workers,
            intra_threads=intra_threads,
        )
        vocabulary = default_vocabulary(args.vocab_size)
        agree, count = check_conversion(args, model, translator, vocabulary)
        info["greedy_outputs_equal_to_ours"] = f"{agree}/{count}"
        common.log(f"[check] {name}: greedy outputs equal to ours on {agree}/{count} sentences")
        if quantization is None and agree != count:
            raise RuntimeError(f"CTranslate2 conversion check failed: {agree}/{count} greedy outputs agree")
        tokens = [[vocabulary[i] for i in s] for s in sentences]
        options = dict(
            beam_size=args.beam_size,
            min_decoding_length=args.output_length,
            max_decoding_length=args.output_length,
            max_batch_size=args.batch_size,
        )
        translator.translate_batch(tokens[: 2 * args.batch_size], **options)

        def run():
            results = translator.translate_batch(tokens, **options)
            return {"tokens": sum(len(r.hypotheses[0]) for r in results), "sentences": len(results)}

        return run

    return common.System(name, setup, baseline=baseline, info=info)


# Main --------------------------------------------------------------------------------


def _parse_tf_threads(parser, value):
    """`"INTRA,INTER"` -> `(intra, inter)`, both positive; None for TensorFlow's own pools."""
    if value is None:
        return None
    try:
        intra, inter = (int(part) for part in value.split(","))
    except ValueError:
        intra = inter = 0
    if intra < 1 or inter < 1:
        parser.error(f"--tf-threads takes two positive integers INTRA,INTER, e.g. 1,2; got {value!r}")
    return intra, inter


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--min-source-length", type=int, default=8)
    parser.add_argument("--max-source-length", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--output-length", type=int, default=20, help="tokens generated per sentence")
    parser.add_argument("--pad-multiple", type=int, default=8, help="TF batches padded to a multiple of this")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds; medians over them")
    parser.add_argument("--threads", type=int, default=2, help="CTranslate2 intra_threads")
    parser.add_argument(
        "--tf-threads",
        default=None,
        metavar="INTRA,INTER",
        help="TensorFlow's intra-op and inter-op thread pools for every TensorFlow system, e.g. 1,2: "
        "one thread per op and two ops at a time, so each of the x2 rows' batches has a core "
        "(TF Serving's --tensorflow_intra_op_parallelism / _inter_op_parallelism; default: "
        "TensorFlow's, a thread per core in each)",
    )
    parser.add_argument("--only", default=None, help="comma-separated name prefixes, e.g. 'ours' or 'ours,ctranslate2'")
    parser.add_argument("--json", default=None, help="write results to this JSON file")
    parser.add_argument("--plot", default=None, help="write a bar chart PNG (matplotlib)")
    args = parser.parse_args(argv)
    threads = _parse_tf_threads(parser, args.tf_threads)

    import tensorflow as tf

    if threads:  # before any op runs: TensorFlow makes its pools once
        tf.config.threading.set_intra_op_parallelism_threads(threads[0])
        tf.config.threading.set_inter_op_parallelism_threads(threads[1])

    # Eager greedy_search calls in the conversion check build new tf.functions: no retracing warnings.
    tf.get_logger().setLevel("ERROR")
    sentences = make_sentences(args.sentences, args.min_source_length, args.max_source_length, args.vocab_size)
    batches = make_batches(sentences, args.batch_size, args.pad_multiple)
    models = OurModels(args)
    workdir = tempfile.mkdtemp(prefix="decode_throughput_")
    systems = [
        ours_system(args, models, batches, "float32", False, "ours fp32", "ours fp32"),
        ours_system(args, models, batches, "float32", True, "ours fp32 XLA", "ours fp32"),
        ours_system(args, models, batches, "float32", True, "ours fp32 XLA x2", "ours fp32", workers=2),
        ours_system(args, models, batches, "float32", False, "ours fp32 x2", "ours fp32", workers=2),
        # "bfloat16" stores the weights in bfloat16, as `export --precision bfloat16` does: no per-step weight casts.
        ours_system(args, models, batches, "bfloat16", False, "ours bf16", "ours fp32"),
        ours_system(args, models, batches, "bfloat16", False, "ours bf16 x2", "ours fp32", workers=2),
        ours_system(args, models, batches, "bfloat16", True, "ours bf16 XLA", "ours fp32"),
        keras_hub_system(args, batches, False, "keras-hub fp32", "ours fp32"),
        keras_hub_system(args, batches, True, "keras-hub fp32 XLA", "ours fp32 XLA"),
        ctranslate2_system(args, models, sentences, None, "ctranslate2 fp32", "ours fp32", workdir),
        ctranslate2_system(args, models, sentences, None, "ctranslate2 fp32 x2", "ours fp32", workdir, workers=2),
        ctranslate2_system(args, models, sentences, "int8", "ctranslate2 int8", "ours fp32", workdir),
    ]
    systems = common.select(systems, args.only)

    machine = common.machine_info()
    common.log(f"load average at start: {machine['load_average_at_start']}")
    try:
        results = common.run_alternating(systems, args.repeats)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    machine["load_average_at_end"] = common.load_average()

    ratios = common.ratio_to_baseline(results, "tokens")
    headers = [
        "system",
        "generated tok/s (median)",
        "sentences/s",
        "min–max tok/s",
        "× baseline",
        "baseline",
        "setup s",
        "+RSS MiB",
        "peak RSS MiB",
    ]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.name, f"skipped: {r.skipped}"] + [""] * (len(headers) - 2))
            continue
        rates = r.rates("tokens")
        rows.append(
            [
                r.name,
                common.fmt(r.median_rate("tokens")),
                common.fmt(r.median_rate("sentences"), ",.1f"),
                f"{min(rates):,.0f}–{max(rates):,.0f}",
                common.fmt(ratios[r.name], ".2f"),
                r.baseline,
                common.fmt(r.setup_seconds, ".1f"),
                common.fmt(r.setup_rss_mb),
                common.fmt(r.peak_rss_mb),
            ]
        )

    versions = common.package_versions(["tensorflow", "keras", "keras-hub", "ctranslate2", "numpy"])
    print(
        f"\n### Decoding throughput, small shape (3+3, d_model 256, 4 heads, d_ff 1024, vocab {args.vocab_size}), "
        "random weights\n"
    )
    print(
        f"{args.sentences} sentences of {args.min_source_length}-{args.max_source_length} source tokens, "
        f"sorted by length, batch {args.batch_size}, beam {args.beam_size}, exactly {args.output_length} "
        f"generated tokens each; {args.repeats} alternating rounds, median shown; TensorFlow's thread pools: "
        f"{f'{threads[0]} intra-op x {threads[1]} inter-op threads' if threads else 'its defaults'}.\n"
    )
    print(common.markdown_table(headers, rows))
    checks = [
        f"{r.name}: {r.info['greedy_outputs_equal_to_ours']}"
        for r in results
        if "greedy_outputs_equal_to_ours" in r.info
    ]
    if checks:
        print("\nCTranslate2 conversion check (greedy outputs equal to ours): " + "; ".join(checks))
    print(
        f"Peak RSS of the process: {common.process_peak_rss_mb():,.0f} MiB. "
        f"Load average: start {machine['load_average_at_start']}, end {machine['load_average_at_end']}; "
        f"{machine.get('cpu', '?')}, {machine['cpu_count']} CPUs."
    )
    print("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))

    common.write_json(
        args.json,
        {
            "benchmark": "decode_throughput",
            "args": vars(args),
            "machine": machine,
            "versions": versions,
            "results": common.results_payload(results, ["tokens", "sentences"]),
        },
    )
    common.plot_bars(args.plot, results, "tokens", "Beam search (K=4), generated tokens/s")


if __name__ == "__main__":
    main()
