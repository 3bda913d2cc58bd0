"""Decoding speed of a trained run on Multi30k test2016: cached vs uncached, with and without XLA.

Beam search as in §6.1 (beam 4, alpha 0.6, output at most source + 50
tokens), batches of 32 sentences in file order, through
`keras_transformer.decoding.make_decode_fn`. The uncached reference reruns
the decoder over the whole prefix at every step, so it is timed on the first
`--uncached-sentences` sentences only. Reports sentences/s and generated
tokens/s (end token included), after one untimed warm-up pass per mode.

Run:
    python benchmarks/decode_multi30k.py runs/multi30k_en_de --json benchmarks/results/<cpu>/decode_multi30k.json
    python benchmarks/decode_multi30k.py RUN_DIR --sentences 256 --uncached-sentences 64 --modes cached,cached-xla
    python benchmarks/decode_multi30k.py RUN_DIR --modes cached,cached-k_finished   # the two stopping rules
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer import decoding  # noqa: E402
from keras_transformer.data import corpora  # noqa: E402
from keras_transformer.inference.translator import Translator  # noqa: E402
from keras_transformer.run_dir import load_run  # noqa: E402

MODES = {
    "cached": dict(use_cache=True, jit_compile=False),
    "cached-xla": dict(use_cache=True, jit_compile=True),
    # fairseq's stopping rule: a sentence ends once K hypotheses have finished.
    "cached-k_finished": dict(use_cache=True, jit_compile=False, early_stopping="k_finished"),
    "cached-xla-k_finished": dict(use_cache=True, jit_compile=True, early_stopping="k_finished"),
    "uncached": dict(use_cache=False, jit_compile=False),
    "uncached-xla": dict(use_cache=False, jit_compile=True),
}


def source_batches(translator, sentences, batch_size):
    return [
        translator.source_ids(tf.constant(sentences[i : i + batch_size])) for i in range(0, len(sentences), batch_size)
    ]


def time_mode(model, batches, mode, beam_size, alpha):
    options = MODES[mode]
    decode = decoding.make_decode_fn(
        model,
        "beam",
        jit_compile=options["jit_compile"],
        beam_size=beam_size,
        alpha=alpha,
        use_cache=options["use_cache"],
        early_stopping=options.get("early_stopping", "exact"),
    )
    for batch in batches:  # warm-up: traces (and compiles) every batch shape
        decode(batch)
    started = time.perf_counter()
    tokens = sentences = 0
    for batch in batches:
        token_ids, _ = decode(batch)
        tokens += int(np.count_nonzero(token_ids.numpy()))
        sentences += int(batch.shape[0])
    seconds = time.perf_counter() - started
    return dict(
        mode=mode,
        sentences=sentences,
        tokens=tokens,
        seconds=round(seconds, 2),
        sentences_per_sec=round(sentences / seconds, 1),
        tokens_per_sec=round(tokens / seconds, 1),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--uncached-sentences", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--beam-size", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument(
        "--modes", default="cached,cached-xla,uncached,uncached-xla", help=f"comma-separated, of: {', '.join(MODES)}"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    model, tokenizer = load_run(args.run_dir)
    translator = Translator(model, tokenizer)
    sentences = corpora.read_lines("test2016", "en")
    results, machine = [], common.machine_info()  # its load average at start
    print(f"load average at start: {machine['load_average_at_start']}")
    print("| mode | sentences | generated tokens | seconds | sentences/s | tokens/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode in args.modes.split(","):
        count = args.sentences if mode.startswith("cached") else min(args.sentences, args.uncached_sentences)
        batches = source_batches(translator, sentences[:count], args.batch_size)
        result = time_mode(model, batches, mode, args.beam_size, args.alpha)
        results.append(result)
        print(
            f"| {mode} | {result['sentences']} | {result['tokens']} | {result['seconds']} | "
            f"{result['sentences_per_sec']} | {result['tokens_per_sec']} |",
            flush=True,
        )
    print(f"load average at end: {open('/proc/loadavg').read().split()[:3]}")
    common.write_json(
        args.json,
        {
            "benchmark": "decode_multi30k",
            "run_dir": args.run_dir,
            "batch_size": args.batch_size,
            "beam_size": args.beam_size,
            "alpha": args.alpha,
            "machine": machine,
            "versions": common.package_versions(["tensorflow", "keras"]),
            "results": results,
        },
    )
    return results


if __name__ == "__main__":
    main()
