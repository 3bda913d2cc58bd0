"""One translation engine in its own process, timed on command (`decode_serving.py` drives it).

`novel_requests.py` serves through the same `savedmodel_server` and `ctranslate2_translator`.

    python benchmarks/serving_worker.py savedmodel EXPORT_DIR SENTENCES_FILE REQUESTS CONCURRENCY \
        [INTRA INTER [KERNELS]]
    python benchmarks/serving_worker.py ctranslate2 MODEL_DIR SENTENCES_FILE MAX_BATCH_SIZE INTER INTRA \
        COMPUTE_TYPE [GEMM]
    python benchmarks/serving_worker.py translator MODEL SENTENCES_FILE BATCH_SIZE WORKERS [KERNELS [THREADS]]
    python benchmarks/serving_worker.py keras_int8 MODEL SENTENCES_FILE BATCH_SIZE WORKERS
    python benchmarks/serving_worker.py litert FILE.tflite SENTENCES_FILE BATCH_SIZE WORKERS THREADS

"savedmodel" imports only tensorflow and tensorflow_text, as a model server
would: it sends the sentences to the `serving_default` signature,
CONCURRENCY calls in flight, as REQUESTS says: a number, that many per call
in file order; or a JSON file listing each call's sentences (line indices),
as the driver plans them (`decode_serving.request_plans`); INTRA and INTER set
TensorFlow's intra-op and inter-op thread pools (TF Serving's
`--tensorflow_intra_op_parallelism` and `--tensorflow_inter_op_parallelism`),
"default" (or absent) TensorFlow's own (one thread per core in each).
KERNELS "onednn" sets `TF_ENABLE_ONEDNN_OPTS=1` before TensorFlow loads (its
oneDNN kernels, which it uses by default only on CPUs with AVX512_VNNI,
AVX512_BF16 or AMX); "default" leaves TensorFlow's choice. "ctranslate2"
imports only ctranslate2 and sentencepiece and calls `translate_batch` on
the whole file (it sorts and batches by length itself) with beam 4, length
penalty 0.6 and at most the call's longest source + 50 tokens (CTranslate2
takes one limit per call; the SavedModel's is each sentence's source + 50).
GEMM "mkl" makes it use Intel MKL (`CT2_USE_MKL=1`), its default on Intel CPUs
only; "default" leaves CTranslate2's choice (oneDNN elsewhere). "translator"
is what `keras-transformer translate --model MODEL` runs (MODEL an export or
a run directory, beam 4 and alpha 0.6): the package's
`load_translator(MODEL).translate(sentences, batch_size=BATCH_SIZE,
workers=WORKERS)`; THREADS "cli" (the default) sets TensorFlow's pools as the
command line does (`cli.threads.set_pools_for(WORKERS)`: cores // WORKERS
intra-op threads, WORKERS inter-op), "default" leaves TensorFlow's own.
"keras_int8" is "translator" on MODEL's Keras model in float32 after Keras's
own `model.quantize("int8")` (int8 weights for the layers Keras can quantize),
decoding with beam 4, alpha 0.6 and source + 50 tokens. "litert" runs a
LiteRT file (`export_litert`, its decoding fixed in it) with
`LiteRTTranslator(FILE, num_threads=THREADS).translate(sentences,
batch_size=BATCH_SIZE, workers=WORKERS)`: one interpreter per worker thread.

Protocol (one JSON object per line): it prints {"ready": ...} after a warm-up
pass; each "run" read on stdin makes one timed pass over all sentences and
prints {"seconds": ..., "peak_rss_mb": ...}; "translations PATH" writes the last pass's output,
one line per sentence; "quit" ends it. Peak memory is VmHWM, which starts anew
at exec (`ru_maxrss` would not do: Linux keeps it across fork and exec, so a
worker would report its parent's peak).
"""

import concurrent.futures
import json
import os
import sys
import time

import common  # stdlib only: the worker still imports nothing of the systems it does not time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BEAM_SIZE, LENGTH_PENALTY, EXTRA_LENGTH = 4, 0.6, 50  # §6.1, as exported


def _choose_kernels(kernels):
    if kernels == "onednn":  # read when TensorFlow loads
        os.environ["TF_ENABLE_ONEDNN_OPTS"] = "1"
    elif kernels != "default":
        raise ValueError(f"kernels must be 'default' or 'onednn', got {kernels!r}")


def savedmodel_engine(
    export_dir, sentences, requests, concurrency, intra="default", inter="default", kernels="default"
):
    serve = savedmodel_server(export_dir, intra, inter, kernels)
    requests = _requests(requests, len(sentences))
    pool = concurrent.futures.ThreadPoolExecutor(int(concurrency))

    def one(rows):
        return serve([sentences[row] for row in rows])

    def translate():
        output = [None] * len(sentences)
        for rows, texts in zip(requests, pool.map(one, requests)):
            for row, text in zip(rows, texts):
                output[row] = text
        return output

    return translate


def savedmodel_server(export_dir, intra="default", inter="default", kernels="default"):
    """`serve(sentences) -> translations` through an export's `serving_default` signature, as a model server calls it.

    Imports only tensorflow and tensorflow_text. `intra`/`inter`: TensorFlow's thread pools, set before anything
    runs ("default": TensorFlow's own); `kernels` as KERNELS above.
    """
    _choose_kernels(kernels)
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    if intra != "default":  # before anything runs: the pools are made once
        tf.config.threading.set_intra_op_parallelism_threads(int(intra))
        tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    signature = tf.saved_model.load(export_dir).signatures["serving_default"]

    def serve(sentences):
        return [t.decode("utf-8") for t in signature(inputs=tf.constant(sentences))["translations"].numpy()]

    return serve


def _requests(requests, count):
    """Each request's sentence rows: REQUESTS a number (that many per request, in file order) or a plan's path."""
    if str(requests).isdigit():
        size = int(requests)
        return [range(i, min(i + size, count)) for i in range(0, count, size)]
    with open(requests, encoding="utf-8") as f:
        plan = json.load(f)
    if sorted(row for rows in plan for row in rows) != list(range(count)):
        raise ValueError(f"{requests} must list each of the {count} sentences' rows once")
    return plan


def translator_engine(model, sentences, batch_size, workers, kernels="default", threads="cli"):
    _choose_kernels(kernels)
    if threads == "cli":  # before anything runs, as `keras-transformer translate` does
        from keras_transformer.cli.threads import set_pools_for

        set_pools_for(int(workers))
    elif threads != "default":
        raise ValueError(f"threads must be 'cli' or 'default', got {threads!r}")
    from keras_transformer.inference.loading import load_translator

    translator = load_translator(model, beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_extra_length=EXTRA_LENGTH)
    return lambda: translator.translate(sentences, batch_size=int(batch_size), workers=int(workers))


def keras_int8_engine(model, sentences, batch_size, workers):
    from keras_transformer.cli.threads import set_pools_for

    set_pools_for(int(workers))
    from keras_transformer.inference.export_dirs import is_export_dir
    from keras_transformer.inference.export_sources import DecodingOptions, translator_of_export, translator_of_run

    # GNMT's penalty whatever the source recorded (an export with fairseq's would keep it otherwise).
    decoding = DecodingOptions(
        beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_extra_length=EXTRA_LENGTH, length_penalty="gnmt"
    )
    load = translator_of_export if is_export_dir(model) else translator_of_run
    translator = load(model, decoding, dtype="float32")
    translator.model.quantize("int8")
    return lambda: translator.translate(sentences, batch_size=int(batch_size), workers=int(workers))


def litert_engine(path, sentences, batch_size, workers, threads):
    from keras_transformer.inference.litert import LiteRTTranslator

    translator = LiteRTTranslator(path, num_threads=int(threads))
    return lambda: translator.translate(sentences, batch_size=int(batch_size), workers=int(workers))


def ctranslate2_engine(model_dir, sentences, max_batch_size, inter, intra, compute_type, gemm="default"):
    encode, translate_pieces = ctranslate2_translator(model_dir, compute_type, inter, intra, gemm)
    pieces = [encode(s) for s in sentences]  # outside the timed pass
    return lambda: translate_pieces(pieces, BEAM_SIZE, LENGTH_PENALTY, int(max_batch_size))


def ctranslate2_translator(model_dir, compute_type, inter, intra, gemm="default"):
    """`(encode, translate_pieces)` for a converted model: a sentence's SentencePiece pieces, and the texts of a list
    of pieces' translations, `translate_pieces(pieces, beam_size, length_penalty, max_batch_size, extra_length)`:
    each output at most the longest source (with the end token) + `extra_length` tokens, as our SavedModel allows.

    Imports only ctranslate2 and sentencepiece; `gemm` as GEMM above.
    """
    if gemm == "mkl":  # read when the library loads
        os.environ["CT2_USE_MKL"] = "1"
    elif gemm != "default":
        raise ValueError(f"gemm must be 'default' or 'mkl', got {gemm!r}")
    import ctranslate2
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(model_dir, "sentencepiece.model"))
    translator = ctranslate2.Translator(
        model_dir, device="cpu", compute_type=compute_type, inter_threads=int(inter), intra_threads=int(intra)
    )

    def translate_pieces(pieces, beam_size, length_penalty, max_batch_size, extra_length=EXTRA_LENGTH):
        results = translator.translate_batch(
            pieces,
            beam_size=beam_size,
            length_penalty=length_penalty,
            max_batch_size=max_batch_size,
            max_decoding_length=max(len(p) for p in pieces) + 1 + extra_length,
        )
        return [processor.decode(r.hypotheses[0]) for r in results]

    return (lambda sentence: processor.encode(sentence, out_type=str)), translate_pieces


def main(argv):
    kind, path, sentences_file, *options = argv
    with open(sentences_file, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f]
    engines = {
        "savedmodel": savedmodel_engine,
        "translator": translator_engine,
        "keras_int8": keras_int8_engine,
        "litert": litert_engine,
        "ctranslate2": ctranslate2_engine,
    }
    translate = engines[kind](path, sentences, *options)
    started = time.perf_counter()
    output = translate()  # warm-up: traces, allocates, spins up threads
    print(
        json.dumps(
            {"ready": True, "warmup_seconds": time.perf_counter() - started, "peak_rss_mb": common.window_peak_rss_mb()}
        ),
        flush=True,
    )
    for line in sys.stdin:
        command = line.split()
        if command[0] == "run":
            started = time.perf_counter()
            output = translate()
            print(
                json.dumps({"seconds": time.perf_counter() - started, "peak_rss_mb": common.window_peak_rss_mb()}),
                flush=True,
            )
        elif command[0] == "translations":
            with open(command[1], "w", encoding="utf-8") as f:
                f.write("".join(t.replace("\n", " ") + "\n" for t in output))
            print(json.dumps({"written": command[1]}), flush=True)
        elif command[0] == "quit":
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
