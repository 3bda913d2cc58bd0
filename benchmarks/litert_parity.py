"""Translate Multi30k with a SavedModel and its LiteRT files: the same translations? the same BLEU? how large?

The SavedModel (a version directory, e.g. the committed model) is
converted to LiteRT files (`export_litert`: float32, and, unless `--no-int8`,
int8 dynamic-range quantization, `export --quantize int8`'s), and each translates a Multi30k split
(default test2016) as `keras-transformer translate --model` would: the
SavedModel with `SavedModelTranslator`, the files with `LiteRTTranslator`.
Reported per file: its size, its ops, the share of translations identical to
the SavedModel's (and, for int8, to float32's), the largest score difference
where they are identical, and the metrics of `corpus_scores` (the lower-cased
tokenized BLEU of Multi30k papers among them). Times are of one pass each,
after a warm-up, to read alongside (a check of answers, not a benchmark).

    python benchmarks/litert_parity.py saved_models/multi30k_en_de/1 \\
        --json benchmarks/results/<machine>/litert_parity.json
    python benchmarks/litert_parity.py saved_models/multi30k_en_de/1 --limit 8   # a quick check
"""

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

from keras_transformer.data.corpora import read_lines  # noqa: E402
from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE  # noqa: E402
from keras_transformer.inference.evaluation import corpus_scores  # noqa: E402
from keras_transformer.inference.litert import LiteRTTranslator, export_litert, info_path  # noqa: E402
from keras_transformer.inference.translator import SavedModelTranslator, resolve_saved_model_dir  # noqa: E402


def timed_translation(translator, sources, batch_size):
    """`(translations, scores, seconds)` of one pass over `sources`, after a warm-up on the first batch."""
    translator.translate(sources[:batch_size], batch_size=batch_size)
    started = time.perf_counter()
    translations, scores = translator.translate(sources, batch_size=batch_size, return_scores=True)
    return translations, scores, time.perf_counter() - started


def agreement(translations, scores, reference_translations, reference_scores):
    """The share of identical translations, and the largest score difference among them."""
    same = [i for i, (a, b) in enumerate(zip(translations, reference_translations)) if a == b]
    differences = [abs(scores[i] - reference_scores[i]) for i in same]
    return {
        "identical": round(len(same) / max(len(translations), 1), 4),
        "identical_count": len(same),
        "max_score_difference_when_identical": round(max(differences), 6) if differences else None,
    }


def compare(export_dir, output_dir, quantizations, split, limit, batch_size, reference_kernels):
    """The report of the SavedModel and of each LiteRT file."""
    sources, references = read_lines(split, "en")[:limit], read_lines(split, "de")[:limit]
    export_dir = resolve_saved_model_dir(export_dir)
    saved = timed_translation(SavedModelTranslator(export_dir), sources, batch_size)
    report = {"saved_model": _entry(export_dir, saved, sources, references)}
    common.log(f"SavedModel: {saved[2]:.1f} s, tokenized BLEU {report['saved_model']['scores']['tok_bleu']:.2f}")
    results = {}
    for quantize in quantizations:
        name = f"litert_{quantize or 'float32'}"
        path = os.path.join(output_dir, f"{name}.tflite")
        started = time.perf_counter()
        export_litert(export_dir, path, quantize=quantize, overwrite=True)
        convert_seconds = time.perf_counter() - started
        translator = LiteRTTranslator(path, reference_kernels=reference_kernels)
        results[name] = timed_translation(translator, sources, batch_size)
        with open(info_path(path), encoding="utf-8") as f:
            info = json.load(f)
        entry = _entry(path, results[name], sources, references)
        entry.update(
            size_bytes=os.path.getsize(path),
            size_mb=round(os.path.getsize(path) / 1e6, 2),
            export_seconds=round(convert_seconds, 1),
            quantization=info.get("quantization"),
            operators=info.get("operators"),
            vs_saved_model=agreement(results[name][0], results[name][1], saved[0], saved[1]),
        )
        entry["tok_bleu_minus_saved_model"] = round(
            entry["scores"]["tok_bleu"] - report["saved_model"]["scores"]["tok_bleu"], 2
        )
        if name != "litert_float32" and "litert_float32" in results:
            entry["vs_float32"] = agreement(results[name][0], results[name][1], *results["litert_float32"][:2])
            entry["tok_bleu_minus_float32"] = round(
                entry["scores"]["tok_bleu"] - report["litert_float32"]["scores"]["tok_bleu"], 2
            )
        report[name] = entry
        common.log(
            f"{name}: {entry['size_mb']} MB, {results[name][2]:.1f} s, tokenized BLEU "
            f"{entry['scores']['tok_bleu']:.2f}, {entry['vs_saved_model']['identical']:.1%} as the SavedModel"
        )
    return report


def _entry(path, result, sources, references):
    translations, _, seconds = result
    return {
        "path": path,
        "seconds": round(seconds, 2),
        "sentences_per_second": round(len(sources) / seconds, 1),
        "scores": corpus_scores(translations, references, lang="de"),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export_dir", help="a SavedModel version directory (or a base directory: its highest version)")
    parser.add_argument("--split", default="test2016", choices=("val", "test2016"), help="Multi30k split")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_TRANSLATE_BATCH_SIZE,
        help=f"sentences per request (default {DEFAULT_TRANSLATE_BATCH_SIZE}, as translate's)",
    )
    parser.add_argument("--no-int8", action="store_true", help="convert float32 only")
    parser.add_argument("--reference-kernels", action="store_true", help="run LiteRT's reference kernels (no XNNPACK)")
    parser.add_argument("--output-dir", help="keep the LiteRT files here (default: a temporary directory)")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)
    quantizations = [None] if args.no_int8 else [None, "int8"]
    with tempfile.TemporaryDirectory(prefix="litert_parity_") as work_dir:
        output_dir = args.output_dir or work_dir
        report = compare(
            args.export_dir, output_dir, quantizations, args.split, args.limit, args.batch_size, args.reference_kernels
        )
    payload = {
        "benchmark": "litert_parity",
        "split": args.split,
        "sentences": len(read_lines(args.split, "en")[: args.limit]),
        "reference_kernels": args.reference_kernels,
        "machine": common.machine_info(),
        "versions": common.package_versions(
            ["keras-transformer", "tensorflow", "tensorflow-text", "ai-edge-litert", "sacrebleu", "sacremoses"]
        ),
        "results": report,
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
