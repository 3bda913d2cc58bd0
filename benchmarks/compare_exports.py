"""Translate Multi30k with exported SavedModels side by side: the same translations? the same BLEU? how fast?

Each export (a version directory) is loaded with `SavedModelTranslator`, as
`keras-transformer translate --model` loads it, and translates a Multi30k
split (default test2016) with its own decoding options, timed in one pass
after a warm-up on the first sentences (a check of answers, not a benchmark:
`decode_serving.py` times alternated rounds). The translations are scored with the current
metrics (`corpus_scores`: cased sacreBLEU, chrF, lower-cased Moses-tokenized
BLEU) and compared with the first export's, sentence by sentence. Written to
check that a re-exported model (`keras-transformer export --model OLD_VERSION ...`)
answers as the old export did:

    python benchmarks/compare_exports.py old=/tmp/old/1 new=saved_models/multi30k_en_de/1 \\
        --json benchmarks/results/amd_epyc_avx512_bf16/reexport.json
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

from keras_transformer.data.corpora import read_lines  # noqa: E402
from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE  # noqa: E402
from keras_transformer.inference.evaluation import corpus_scores  # noqa: E402
from keras_transformer.inference.translator import SavedModelTranslator  # noqa: E402


def translate_with(export_dir, sources, batch_size):
    """`(translations, seconds, export.json)` of one export over `sources`."""
    translator = SavedModelTranslator(export_dir)
    translator.translate(sources[:batch_size], batch_size=batch_size)  # warm-up: traces and loads the kernels
    started = time.perf_counter()
    translations = translator.translate(sources, batch_size=batch_size)
    seconds = time.perf_counter() - started
    with open(os.path.join(translator.path, "assets", "export.json"), encoding="utf-8") as f:
        info = json.load(f)
    return translations, seconds, info


def compare(exports, split, limit, batch_size):
    """`{name: report}` for each `name -> export_dir` of `exports`, the first one the reference."""
    sources = read_lines(split, "en")[:limit]
    references = read_lines(split, "de")[:limit]
    reports, reference_translations = {}, None
    for name, export_dir in exports.items():
        translations, seconds, info = translate_with(export_dir, sources, batch_size)
        if reference_translations is None:
            reference_translations = translations
        same = sum(a == b for a, b in zip(translations, reference_translations))
        reports[name] = {
            "export": export_dir,
            "exported_at": info.get("exported_at"),
            "keras_transformer_version": info.get("keras_transformer_version"),
            "decoding": info.get("decoding"),
            "precision": info.get("precision"),
            "seconds": round(seconds, 2),
            "sentences_per_second": round(len(sources) / seconds, 1),
            "identical_to_first": round(same / len(sources), 4),
            "scores": corpus_scores(translations, references, lang="de"),
        }
        scores = reports[name]["scores"]
        common.log(
            f"{name}: {seconds:.1f} s, BLEU {scores['bleu']:.2f} / tokenized {scores['tok_bleu']:.2f} / "
            f"chrF {scores['chrf']:.2f}, {same}/{len(sources)} translations as the first"
        )
    return reports


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "exports", nargs="+", metavar="NAME=EXPORT_DIR", help="version directories; the first is the reference"
    )
    parser.add_argument("--split", default="test2016", choices=("val", "test2016"), help="Multi30k split")
    parser.add_argument("--limit", type=int, default=None, help="only the first N sentences")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_TRANSLATE_BATCH_SIZE,
        help=f"sentences per request (default {DEFAULT_TRANSLATE_BATCH_SIZE}, as translate's)",
    )
    parser.add_argument("--json", help="write the comparison here")
    args = parser.parse_args(argv)
    exports = {}
    for item in args.exports:
        name, _, path = item.partition("=")
        if not name or not path or name in exports:
            parser.error(f"each export is NAME=EXPORT_DIR with a name of its own, got {item!r}")
        exports[name] = path
    payload = {
        "benchmark": "compare_exports",
        "split": args.split,
        "sentences": len(read_lines(args.split, "en")[: args.limit]),
        "machine": common.machine_info(),
        "versions": common.package_versions(
            ["keras-transformer", "tensorflow", "tensorflow-text", "sacrebleu", "sacremoses"]
        ),
        "exports": compare(exports, args.split, args.limit, args.batch_size),
    }
    common.write_json(args.json, payload)
    return payload


if __name__ == "__main__":
    main()
