"""A served request's first time against its replay: what a request of new sentences costs over a repeated one.

`decode_serving.py` warms each system up on the sentences it then times, so every timed request repeats one the
system has served. A server's traffic does not repeat. In our SavedModel, TensorFlow's oneDNN kernels (where TensorFlow
uses them; each worker records whether it does) create a primitive, a compiled kernel, for each new operand shape
and cache it. The shapes depend on the sentences: the batch shrinks through sizes set by when its sentences finish,
the cross-attention spans the request's longest source, and the self-attention's cache grows by a step at a time
for as long as the request's longest output. New sentences bring new shapes; a replay finds them cached. This
script times both, for each of our SavedModels given and for CTranslate2 int8 on the first one's weights:

* each system runs in a fresh worker process with one thread (one request in flight, as each of
  `decode_serving.py`'s requests runs), warmed up on one request of `--sentences` sentences;
* then, for each of `--requests` further requests of as many new sentences (Multi30k test2016, then val, in file
  order, as a client would send them), it serves the request ("novel") and at once the same request again
  ("replayed"), timing each in wall-clock and in process CPU seconds;
* the systems' workers take turns for `--rounds` rounds, the first system of a round rotating; each worker is a
  fresh process, so every request is new to it.

Reported per system: the medians of the novel and replayed seconds per request, sentences/s, and the median of the
per-request ratios novel / replayed (CPU seconds, which another process on the machine disturbs less than the
clock), and its wall time over the first system's for the same request of the same round (medians). Our SavedModels
decode with their exports' precision and options (e.g. `export --precision bfloat16 --beam 4 --alpha 0.6
--length-penalty gnmt`). CTranslate2 runs the first export's weights converted with `export_ctranslate2`, int8, with
that export's beam size and alpha in its own length penalty (log P / length ** alpha, the export's "average"; where
the export uses GNMT's, the two rank some hypotheses differently), at most the request's longest source + 50 tokens
(one limit per call; the export's is each sentence's), and `max_batch_size`
`CT2_MAX_BATCH_SIZE`; the results file records these settings.

Usage:
    .venv/bin/python benchmarks/novel_requests.py bf16=EXPORT_DIR --rounds 3 \\
        --json benchmarks/results/amd_epyc_zen5/novel_requests.json
    .venv/bin/python benchmarks/novel_requests.py before=OLD/1 after=NEW/1 --no-ctranslate2   # two exports
    .venv/bin/python benchmarks/novel_requests.py a=EXPORT_DIR --requests 1 --sentences 20 --rounds 1   # smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402
import serving_worker  # noqa: E402

EXTRA_LENGTH = serving_worker.EXTRA_LENGTH  # CTranslate2: the request's longest source (with the end token) + 50
CT2_MAX_BATCH_SIZE = 8
CT2 = "ctranslate2 int8"


def request_rows(pool_size, size, requests):
    """The rows of the warm-up request and of each timed request: consecutive slices of `size` rows of the pool."""
    if (requests + 1) * size > pool_size:
        raise SystemExit(
            f"novel_requests: {requests} requests of {size} sentences and a warm-up need {(requests + 1) * size} "
            f"sentences; test2016 and val hold {pool_size}"
        )
    return [list(range(r * size, (r + 1) * size)) for r in range(requests + 1)]


def sentence_pool():
    """Multi30k test2016 then val, English, in file order."""
    from keras_transformer.data import corpora

    return corpora.read_lines("test2016", "en") + corpora.read_lines("val", "en")


def timed(serve):
    """`(wall seconds, process CPU seconds)` of one call of `serve`."""
    wall, cpu = time.perf_counter(), time.process_time()
    serve()
    return time.perf_counter() - wall, time.process_time() - cpu


def ours_server(export_dir):
    """A request's server for our SavedModel (one intra-op and one inter-op thread): `serve(sentences)`."""
    return serving_worker.savedmodel_server(export_dir, intra=1, inter=1)


def export_decoding(export_dir):
    """The decoding options an export recorded (`assets/export.json`)."""
    path = os.path.join(export_dir, "assets", "export.json")
    if not os.path.isfile(path):
        raise SystemExit(f"novel_requests: {export_dir} is not an exported version: no {path}")
    with open(path, encoding="utf-8") as f:
        return json.load(f)["decoding"]


def ctranslate2_settings(decoding):
    """CTranslate2's settings for an export's `decoding`: its beam size and alpha, int8, one thread."""
    return dict(
        compute_type="int8",
        beam_size=decoding["beam_size"],
        length_penalty=decoding["alpha"],
        max_batch_size=CT2_MAX_BATCH_SIZE,
        inter_threads=1,
        intra_threads=1,
        extra_length=EXTRA_LENGTH,
    )


def ctranslate2_server(model_dir, settings):
    """A request's server for CTranslate2 with `settings`, tokenizing as our SavedModel does inside."""
    encode, translate_pieces = serving_worker.ctranslate2_translator(
        model_dir, settings["compute_type"], settings["inter_threads"], settings["intra_threads"]
    )

    def serve(sentences):
        return translate_pieces(
            [encode(s) for s in sentences],
            settings["beam_size"],
            settings["length_penalty"],
            settings["max_batch_size"],
            settings["extra_length"],
        )

    return serve


def worker(system, path, size, requests, settings=None):
    """Serves the warm-up request, then each timed request novel and replayed; prints the times as a JSON line.

    `settings`: CTranslate2's (`ctranslate2_settings`), for the system `CT2`.
    """
    pool = sentence_pool()
    rows = request_rows(len(pool), size, requests)
    serve = ctranslate2_server(path, settings) if system == CT2 else ours_server(path)
    serve([pool[row] for row in rows[0]])  # warm-up: loads, traces, creates the first shapes' kernels
    times = []
    for request in rows[1:]:
        sentences = [pool[row] for row in request]
        novel = timed(lambda s=sentences: serve(s))
        replayed = timed(lambda s=sentences: serve(s))
        times.append(dict(novel=novel, replayed=replayed))
    onednn = None
    if system != CT2:
        from keras_transformer import compat

        onednn = compat.onednn_kernels_enabled()
    print("\n" + json.dumps(dict(system=system, times=times, onednn_kernels=onednn)))


def summary(rounds, size):
    """Per system, from every round's per-request times: medians, sentences/s and novel / replayed; and its wall
    time over the first system's, request by request of the same round (`wall_over_first`, medians), which the
    requests' different lengths do not blur."""
    out = {}
    first = next(iter(rounds.values()))
    for system, workers in rounds.items():
        times = [t for worker_times in workers for t in worker_times]
        wall = {kind: common.median([t[kind][0] for t in times]) for kind in ("novel", "replayed")}
        cpu = {kind: common.median([t[kind][1] for t in times]) for kind in ("novel", "replayed")}
        out[system] = dict(
            requests_timed=len(times),
            median_wall_seconds={kind: round(v, 4) for kind, v in wall.items()},
            median_cpu_seconds={kind: round(v, 4) for kind, v in cpu.items()},
            sentences_per_second={kind: round(size / v, 1) for kind, v in wall.items()},
            novel_over_replayed_cpu=round(common.median([t["novel"][1] / t["replayed"][1] for t in times]), 3),
            novel_over_replayed_wall=round(common.median([t["novel"][0] / t["replayed"][0] for t in times]), 3),
            wall_over_first={kind: round(_paired_ratio(workers, first, kind), 3) for kind in ("novel", "replayed")},
        )
    return out


def _paired_ratio(workers, first, kind):
    """The median over rounds and requests of `workers`' `kind` wall time over `first`'s for the same request."""
    pairs = [(t, f) for times, first_times in zip(workers, first) for t, f in zip(times, first_times)]
    return common.median([t[kind][0] / f[kind][0] for t, f in pairs])


def convert_for_ctranslate2(export_dir, work_dir):
    """The export's weights as a CTranslate2 model directory (float32 weights; int8 is chosen when loaded)."""
    from keras_transformer.inference.ctranslate2 import export_ctranslate2
    from keras_transformer.inference.export_sources import load_export

    model, tokenizer, _ = load_export(export_dir, dtype="float32")
    return export_ctranslate2(model, os.path.join(work_dir, "ct2"), tokenizer=tokenizer)


def parse_exports(parser, items):
    """`{name: export_dir}` of the `NAME=EXPORT_DIR` arguments; each name given once, none `CT2`."""
    exports = {}
    for item in items:
        name, _, path = item.partition("=")
        if not name or not path or name == CT2 or name in exports:
            parser.error(f"give each export once as NAME=EXPORT_DIR, NAME not {CT2!r}: got {item!r}")
        exports[name] = path
    return exports


def run_rounds(paths, args, settings):
    """Every round's times of each system (`paths`: system -> model), the first system rotating each round; and
    whether each worker of ours ran oneDNN kernels."""
    rounds, onednn = {system: [] for system in paths}, {}
    systems = list(paths)
    for round_ in range(args.rounds):
        for system in systems[round_ % len(systems) :] + systems[: round_ % len(systems)]:
            common.log(f"round {round_ + 1}/{args.rounds}: {system}")
            command = [sys.executable, os.path.abspath(__file__), paths[system], "--worker", system,
                       "--sentences", str(args.sentences), "--requests", str(args.requests)]  # fmt: skip
            if system == CT2:
                command += ["--ctranslate2-settings", json.dumps(settings)]
            result = common.json_from_process(command, f"{system} worker")
            rounds[system].append(result["times"])
            onednn.setdefault(system, result["onednn_kernels"])
    return rounds, onednn


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("exports", nargs="+", metavar="NAME=EXPORT_DIR", help="exported SavedModel versions")
    parser.add_argument("--sentences", type=int, default=250, help="sentences per request (default 250)")
    parser.add_argument("--requests", type=int, default=6, help="timed requests per worker (default 6)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fresh workers, taking turns (default 3)")
    parser.add_argument("--no-ctranslate2", action="store_true", help="time our exports only")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a worker's one positional is its model's path
    parser.add_argument("--ctranslate2-settings", type=json.loads, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag in ("sentences", "requests", "rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
    common.quiet_tensorflow()
    if args.worker:
        worker(args.worker, args.exports[0], args.sentences, args.requests, args.ctranslate2_settings)
        return 0
    exports = parse_exports(parser, args.exports)
    decoding = {name: export_decoding(path) for name, path in exports.items()}  # before any work
    request_rows(len(sentence_pool()), args.sentences, args.requests)
    settings = None if args.no_ctranslate2 else ctranslate2_settings(next(iter(decoding.values())))
    machine = common.machine_info()
    with tempfile.TemporaryDirectory() as work_dir:
        paths = {name: os.path.abspath(path) for name, path in exports.items()}
        if settings:
            paths[CT2] = convert_for_ctranslate2(next(iter(paths.values())), work_dir)
        rounds, onednn = run_rounds(paths, args, settings)
    result = summary(rounds, args.sentences)
    print(json.dumps(result, indent=2))
    machine["load_average_at_end"] = common.load_average()
    versions = common.package_versions(["tensorflow", "tensorflow-text", "keras", "ctranslate2"])
    payload = dict(
        benchmark="novel_requests",
        exports=exports,
        decoding=decoding,
        ctranslate2=settings,
        onednn_kernels=onednn,
        sentences_per_request=args.sentences,
        requests_per_worker=args.requests,
        rounds=args.rounds,
        machine=machine,
        versions=versions,
        results=result,
    )
    common.write_json(args.json, payload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
