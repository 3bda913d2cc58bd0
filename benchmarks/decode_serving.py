"""Translating real text through the exported SavedModel against CTranslate2, each in its own process.

Workload: Multi30k test2016 (1,000 English sentences, shipped with the
package) translated by a trained model (`RUN_DIR`, default the demo's
`runs/multi30k_en_de`, or an exported version such as the committed
`saved_models/multi30k_en_de/1`) with beam 4, GNMT's length penalty 0.6 and at most source +
50 tokens (§6.1). Systems, each a fresh process (`serving_worker.py`):

* ours: the run exported with `export_saved_model(..., beam_size=4,
  alpha=0.6, dtype=...)`, loaded with only tensorflow and tensorflow_text,
  the sentences sent in requests as `SavedModelTranslator.translate` batches
  them (sorted by length, each round of requests in flight dealt sentences
  of the same lengths; `--client file`: in file order, as before):
  "ours float32" and "ours bfloat16" (what
  `--precision auto` exports on a CPU with AVX512_BF16 / AMX-BF16), and
  "ours bfloat16 k_finished", the same with `early_stopping="k_finished"`
  (not the default: it shows what the exact stopping rule costs), in
  "ours bfloat16"'s setting;
* LiteRT: the same model as one `.tflite` file (`export_litert`), float32
  ("litert float32") and with LiteRT's dynamic-range int8 weights ("litert
  int8"), run by `LiteRTTranslator` (one interpreter per call in flight);
* "keras int8": the model in float32 after Keras's own `quantize("int8")`,
  decoded by the package's `Translator` (Keras quantizes its `Dense` layers,
  the feed-forward networks; it skips the others);
* CTranslate2: the same weights converted with `export_ctranslate2`,
  float32 compute ("ctranslate2 float32", the baseline) and, for
  reference, its int8 weights (CTranslate2 has no bfloat16 on CPU).

Each system first gets its best setting on this machine: every candidate
(request size x requests in flight x TensorFlow's thread pools x its kernels for ours, see
`ours_candidates`; max_batch_size x
inter_threads/intra_threads x GEMM library for CTranslate2, see `ct2_candidates`; `LITERT_CANDIDATES` and
`KERAS_INT8_CANDIDATES` for the others) is started, warmed up and timed
in `--tuning-passes` passes (default 2, its fastest pass counts), and the fastest candidate is kept. Then the kept
systems' timed passes alternate
for `--repeats` rounds (medians reported); a row's `setup_rss_mb` and
`peak_rss_mb` are its worker process's peak resident memory after the
warm-up and after all runs. BLEU (lower-cased tokenized, as
Multi30k papers; cased sacreBLEU too) is computed on each system's output,
and the share of sentences whose translation equals "ours float32"'s.

CTranslate2 has its own length penalty, `score / length ** alpha`, where the
SavedModel divides by GNMT's `((5 + length) / 6) ** alpha`, and its own
stopping rule; translations differ where these rank hypotheses differently.

Usage:
    .venv/bin/python benchmarks/decode_serving.py runs/multi30k_en_de \
        --json benchmarks/results/avx512_bf16/decode_serving.json
    .venv/bin/python benchmarks/decode_serving.py RUN_DIR --sentences 200 --repeats 1   # quick
    .venv/bin/python benchmarks/decode_serving.py RUN_DIR --precisions float32   # no bfloat16 (e.g. emulated)
    .venv/bin/python benchmarks/decode_serving.py RUN_DIR --litert none   # no LiteRT files
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serving_worker.py")
BEAM_SIZE, ALPHA = 4, 0.6  # §6.1
# GNMT's penalty (the SavedModel's default) whatever the source recorded: a re-export keeps a recorded one.
LENGTH_PENALTY = "gnmt"
# (sentences per request, requests in flight, intra-op threads, inter-op threads); None: TensorFlow's pools
# (a thread per core in each). One intra-op thread per request in flight runs each request on a core of its own,
# as CTranslate2's inter_threads do (TF Serving: --tensorflow_intra_op_parallelism / _inter_op_parallelism).
OURS_CANDIDATES = [
    (64, 2, None, None),
    (250, 2, None, None),
    (500, 2, None, None),
    (1000, 1, None, None),
    (250, 2, 1, 2),
    (500, 2, 1, 2),
    (250, 4, 1, 4),
]
# `ours_candidates` adds TensorFlow's kernels.
# (max_batch_size, inter_threads, intra_threads); `ct2_candidates` adds the GEMM library.
CT2_CANDIDATES = [(8, 2, 1), (16, 2, 1), (32, 2, 1), (64, 2, 1), (64, 1, 2), (500, 2, 1)]
# LiteRT: (sentences per call, calls in flight, threads per interpreter); each call in flight has its own interpreter.
LITERT_CANDIDATES = [(8, 2, 1), (16, 2, 1)]
# Keras's quantize("int8") on the package's `Translator`: (sentences per batch, batches in flight).
KERAS_INT8_CANDIDATES = [(64, 2), (250, 2), (500, 1)]
VERSIONS_OF = ["tensorflow", "tensorflow-text", "keras", "ctranslate2", "ai-edge-litert"]


def ct2_candidates(vendor=None):
    """`CT2_CANDIDATES`, each with its GEMM library: CTranslate2 uses Intel MKL on Intel CPUs and oneDNN on
    others, where `CT2_USE_MKL=1` may be faster; there both are tried and the tuning keeps the faster.

    (On an AMD EPYC with AVX2 only, MKL was the faster in float32 and far slower in int8.)
    """
    vendor = vendor or common.cpu_vendor()
    libraries = ["default"] if vendor == "GenuineIntel" else ["default", "mkl"]
    return [(*candidate, library) for library in libraries for candidate in CT2_CANDIDATES]


def ours_candidates(onednn_by_default=None):
    """`OURS_CANDIDATES`, each with TensorFlow's kernels: "default" (TensorFlow's choice) and, on CPUs where that
    is not oneDNN (without AVX512_VNNI, AVX512_BF16 or AMX), also "onednn" (`TF_ENABLE_ONEDNN_OPTS=1` in the
    serving process, as a server's environment can set it); the tuning keeps the faster.

    (On an AMD EPYC with AVX2 only, one request of 500 sentences ran 1.6x faster on oneDNN's kernels with
    TensorFlow's default thread pools, and about 1.1x with one intra-op thread per request: see the
    benchmark README.)
    """
    if onednn_by_default is None:
        onednn_by_default = tensorflow_uses_onednn_by_default()
    kernels = ["default"] if onednn_by_default else ["default", "onednn"]
    return [(*candidate, kind) for kind in kernels for candidate in OURS_CANDIDATES]


def tensorflow_uses_onednn_by_default():
    """Whether TensorFlow, with `TF_ENABLE_ONEDNN_OPTS` unset, runs oneDNN's kernels on this CPU (asked in a fresh
    process: the variable is read once, when TensorFlow loads)."""
    probe = "from keras_transformer import compat; print(compat.onednn_kernels_enabled())"
    environ = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}
    output = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env=dict(environ, TF_CPP_MIN_LOG_LEVEL="3"),
    ).stdout.split()
    return output[-1] == "True"


def write_sentences_file(work_dir, sentences):
    """`sentences`, one per line, in `work_dir`: the file `serving_worker.py` reads; returns its path."""
    path = os.path.join(work_dir, "sources.en")
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(s + "\n" for s in sentences))
    return path


class Worker:
    """A `serving_worker.py` process, warmed up and waiting for commands."""

    def __init__(self, args, sentences_file, environ=None):
        self.process = subprocess.Popen(
            [sys.executable, WORKER, *map(str, args[:2]), sentences_file, *map(str, args[2:])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **(environ or {})),
        )
        self.ready = self._read()

    def _read(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.process.args} died (exit {self.process.wait()})")
        self.last_reply = json.loads(line)
        return self.last_reply

    def command(self, *words):
        self.process.stdin.write(" ".join(words) + "\n")
        self.process.stdin.flush()
        return self._read()

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.write("quit\n")
            self.process.stdin.close()
            self.process.wait(timeout=60)


def best_setting(name, candidates, make_args, sentences_file, passes=2):
    """Times each candidate `passes` times after its warm-up, keeping its fastest pass (one slow pass on a
    shared machine would otherwise pick the setting); returns `(best candidate, {candidate: seconds})`."""
    seconds = {}
    for candidate in candidates:
        worker = Worker(make_args(candidate), sentences_file)
        try:
            seconds[candidate] = min(worker.command("run")["seconds"] for _ in range(passes))
        finally:
            worker.close()
        common.log(f"[tune] {name} {candidate}: {seconds[candidate]:.2f} s")
    return min(seconds, key=seconds.get), seconds


def prepare_models(source, work_dir, precisions=("float32", "bfloat16"), litert=("float32", "int8")):
    """Exports `source` (a run directory or an exported version) as SavedModels (`precisions`), as LiteRT files
    (`litert`: float32 and/or int8 weights) and as a CTranslate2 model; returns their paths by system."""
    from keras_transformer.inference.ctranslate2 import export_ctranslate2
    from keras_transformer.inference.export_dirs import is_export_dir
    from keras_transformer.inference.export_sources import DecodingOptions, load_export
    from keras_transformer.inference.litert import export_litert
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.run_dir import load_run

    paths = {}
    for precision in precisions:
        paths[precision] = export_saved_model(
            source,
            os.path.join(work_dir, precision),
            version=1,
            beam_size=BEAM_SIZE,
            alpha=ALPHA,
            length_penalty=LENGTH_PENALTY,
            dtype=precision,
        )
    if "bfloat16" in precisions:  # not the default: fairseq's stopping rule, to show what the exact one costs
        paths["bfloat16 k_finished"] = export_saved_model(
            source,
            os.path.join(work_dir, "bfloat16_k_finished"),
            version=1,
            beam_size=BEAM_SIZE,
            alpha=ALPHA,
            length_penalty=LENGTH_PENALTY,
            dtype="bfloat16",
            early_stopping="k_finished",
        )
    decoding = DecodingOptions(beam_size=BEAM_SIZE, alpha=ALPHA, length_penalty=LENGTH_PENALTY)
    for weights in litert:
        path = os.path.join(work_dir, f"litert_{weights}.tflite")
        paths[f"litert {weights}"] = export_litert(
            source, path, decoding, quantize=None if weights == "float32" else weights, overwrite=True
        )
    if is_export_dir(source):
        model, tokenizer, _ = load_export(source, dtype="float32")
    else:
        model, tokenizer = load_run(source, dtype="float32")
    paths["ctranslate2"] = export_ctranslate2(model, os.path.join(work_dir, "ct2"), tokenizer=tokenizer)
    paths["keras int8"] = source  # quantized in its worker, after loading
    return paths


def _ours_label(candidate):
    request_size, concurrency, intra, inter, kernels = candidate
    threads = f", {intra} intra-op x {inter} inter-op threads" if intra is not None else ""
    return f"{request_size} per request, {concurrency} in flight{threads}, {kernels} kernels"


def request_plans(work_dir, sentences, client="translate"):
    """How the client cuts `sentences` into requests.

    Returns `plan(request_size, concurrency)` -> `serving_worker.py`'s REQUESTS.

    "translate": as `SavedModelTranslator.translate` batches them
    (`even_batches` of the sentences longest first: each round of
    `concurrency` requests is dealt sentences of the same lengths), written
    to a JSON file in `work_dir`; "file": `request_size` per request in file
    order, as this benchmark sent them before (see the benchmark README).
    """
    if client == "file":
        return lambda request_size, concurrency: request_size
    if client != "translate":
        raise ValueError(f"client must be 'translate' or 'file', got {client!r}")
    from keras_transformer.inference.batching import even_batches, length_order

    order = length_order(sentences)

    def plan(request_size, concurrency):
        path = os.path.join(work_dir, f"requests_{request_size}x{concurrency}.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump([batch.tolist() for batch in even_batches(order, request_size, concurrency)], f)
        return path

    return plan


def _ours_args(candidate, path, plan=None):
    """`serving_worker.py savedmodel` arguments; `plan` (`request_plans`) makes the requests (default: file order)."""
    request_size, concurrency, intra, inter, kernels = candidate
    requests = plan(request_size, concurrency) if plan else request_size
    return ["savedmodel", path, requests, concurrency, intra or "default", inter or "default", kernels]


def systems_to_time(paths, sentences_file, only, precisions=("float32", "bfloat16"), passes=2, plan=None):
    """The systems in their best settings (`passes` tuning passes per setting): `[(name, worker args, tuning)]`.

    `plan`: how our requests are made (`request_plans`; default file order).
    """
    chosen = []
    candidates = ours_candidates()
    for precision in precisions:
        name = f"ours {precision}"
        if only and only not in name:
            continue
        args = lambda c, p=precision: _ours_args(c, paths[p], plan)  # noqa: E731
        best, tried = best_setting(name, candidates, args, sentences_file, passes)
        setting = dict(
            request_size=best[0],
            concurrency=best[1],
            intra_op_threads=best[2] or "default",
            inter_op_threads=best[3] or "default",
            kernels=best[4],
        )
        chosen.append((name, args(best), dict(setting=setting, tuning={_ours_label(c): s for c, s in tried.items()})))
        if precision == "bfloat16":  # the same export with k_finished stopping, in the same setting
            chosen.append(
                (
                    f"{name} k_finished",
                    _ours_args(best, paths["bfloat16 k_finished"], plan),
                    dict(setting=setting, early_stopping="k_finished"),
                )
            )
    chosen += _package_systems(paths, sentences_file, only, passes)
    for compute_type in ("float32", "int8"):
        name = f"ctranslate2 {compute_type}"
        if only and only not in name:
            continue
        args = lambda c, t=compute_type: ["ctranslate2", paths["ctranslate2"], *c[:3], t, c[3]]  # noqa: E731
        best, tried = best_setting(name, ct2_candidates(), args, sentences_file, passes)
        chosen.append(
            (
                name,
                args(best),
                dict(
                    setting=dict(max_batch_size=best[0], inter_threads=best[1], intra_threads=best[2], gemm=best[3]),
                    tuning={
                        f"max_batch_size {b}, inter {i}, intra {t}, gemm {g}": s for (b, i, t, g), s in tried.items()
                    },
                ),
            )
        )
    return chosen


def _package_systems(paths, sentences_file, only, passes):
    """The LiteRT files (`paths["litert float32"]`, `paths["litert int8"]`) and Keras's `quantize("int8")` of the
    model in their best settings: `[(name, worker args, tuning)]`."""
    chosen = []
    for name in [name for name in paths if name.startswith("litert ")] + ["keras int8"]:
        if only and only not in name:
            continue
        if name == "keras int8":
            candidates, labels = KERAS_INT8_CANDIDATES, ("batch_size", "workers")
            args = lambda c: ["keras_int8", paths["keras int8"], *c]  # noqa: E731
        else:
            candidates, labels = LITERT_CANDIDATES, ("batch_size", "workers", "threads")
            args = lambda c, n=name: ["litert", paths[n], *c]  # noqa: E731
        best, tried = best_setting(name, candidates, args, sentences_file, passes)
        chosen.append(
            (
                name,
                args(best),
                dict(
                    setting=dict(zip(labels, best)),
                    tuning={", ".join(f"{k} {v}" for k, v in zip(labels, c)): t for c, t in tried.items()},
                ),
            )
        )
    return chosen


def score_outputs(outputs, references):
    from keras_transformer.inference.evaluation import corpus_scores

    scores = {name: corpus_scores(lines, references) for name, lines in outputs.items()}
    base = outputs.get("ours float32")
    for name, lines in outputs.items():
        scores[name] = {key: round(value, 2) for key, value in scores[name].items() if isinstance(value, float)}
        if base is not None:
            scores[name]["identical_to_ours_float32"] = round(sum(a == b for a, b in zip(lines, base)) / len(lines), 3)
    return scores


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "run_dir", nargs="?", default="runs/multi30k_en_de", help="a training run directory or an exported version"
    )
    parser.add_argument("--sentences", type=int, default=1000, help="the first N sentences of test2016")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="time only the systems whose name contains this")
    parser.add_argument(
        "--precisions",
        default="float32,bfloat16",
        help="our SavedModels to time, comma-separated (default %(default)s; bfloat16 also times k_finished stopping)",
    )
    parser.add_argument(
        "--litert",
        default="float32,int8",
        help="LiteRT files to time, comma-separated weights (float32, int8), or none (default %(default)s)",
    )
    parser.add_argument(
        "--tuning-passes",
        type=int,
        default=2,
        help="passes over the file per candidate setting, the fastest kept (default %(default)s)",
    )
    parser.add_argument(
        "--client",
        choices=("translate", "file"),
        default="translate",
        help="how our requests are made: as `SavedModelTranslator.translate` batches the sentences "
        "(default), or in file order (`request_plans`)",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.tuning_passes < 1:
        parser.error(f"--tuning-passes must be at least 1, got {args.tuning_passes}")
    precisions = tuple(p.strip() for p in args.precisions.split(","))
    litert = () if args.litert == "none" else tuple(w.strip() for w in args.litert.split(","))
    if not set(litert) <= {"float32", "int8"}:
        parser.error(f"--litert takes float32 and/or int8, or none, got {args.litert!r}")
    if not precisions or not set(precisions) <= {"float32", "bfloat16"}:
        parser.error(f"--precisions takes float32 and/or bfloat16, got {args.precisions!r}")

    from keras_transformer.data import corpora

    sources = corpora.read_lines("test2016", "en")[: args.sentences]
    references = corpora.read_lines("test2016", "de")[: args.sentences]
    machine = common.machine_info()
    with tempfile.TemporaryDirectory(prefix="decode_serving_") as work_dir:
        sentences_file = write_sentences_file(work_dir, sources)
        paths = prepare_models(args.run_dir, work_dir, precisions, litert)
        chosen = systems_to_time(
            paths,
            sentences_file,
            args.only,
            precisions,
            args.tuning_passes,
            request_plans(work_dir, sources, args.client),
        )
        workers = {}

        def setup(name, worker_args):
            def start():
                workers[name] = Worker(worker_args, sentences_file)
                return lambda: (workers[name].command("run"), {"sentences": len(sources)})[1]

            return start

        systems = [
            common.System(name, setup(name, worker_args), baseline="ctranslate2 float32", info=info)
            for name, worker_args, info in chosen
        ]
        try:
            results = common.run_alternating(systems, args.repeats)
            for result in results:  # memory is the worker's, not this driver's: after warm-up, after the last run
                result.setup_rss_mb = workers[result.name].ready["peak_rss_mb"]
                result.peak_rss_mb = workers[result.name].last_reply["peak_rss_mb"]
            outputs = {}
            for name, worker in workers.items():
                path = os.path.join(work_dir, name.replace(" ", "_") + ".de")
                worker.command("translations", path)
                with open(path, encoding="utf-8") as f:
                    outputs[name] = [line.rstrip("\n") for line in f]
        finally:
            for worker in workers.values():
                worker.close()
    quality = score_outputs(outputs, references)
    ratios = common.ratio_to_baseline(results, "sentences")
    rows = [
        [
            r.name,
            json.dumps(r.info.get("setting")),
            common.fmt(r.median_rate("sentences"), ",.1f"),
            common.fmt(ratios[r.name], ".2f"),
            quality[r.name]["tok_bleu"],
            quality[r.name]["bleu"],
            quality[r.name].get("identical_to_ours_float32", "–"),
        ]
        for r in results
    ]
    print(
        common.markdown_table(
            ["system", "best setting", "sentences/s", "x CT2 fp32", "tok BLEU", "BLEU", "same as ours fp32"], rows
        )
    )
    payload = {
        "benchmark": "decode_serving",
        "run_dir": args.run_dir,
        "sentences": len(sources),
        "beam_size": BEAM_SIZE,
        "alpha": ALPHA,
        "repeats": args.repeats,
        "tuning_passes": args.tuning_passes,
        "client": args.client,
        "machine": machine,
        "versions": common.package_versions(VERSIONS_OF),
        "results": common.results_payload(results, ["sentences"]),
        "quality": quality,
        "wall_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
