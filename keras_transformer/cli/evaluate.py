"""`keras-transformer evaluate`: corpus sacreBLEU, chrF and lower-cased tokenized BLEU, as JSON."""

import json

from keras_transformer.cli.decoding_options import add_model_options, load_translator


def register(subparsers):
    parser = subparsers.add_parser(
        "evaluate", help="corpus sacreBLEU and chrF of a model on a test set, as JSON",
    )
    add_model_options(parser)
    parser.add_argument("--src", required=True, help="source sentences, one per line")
    parser.add_argument("--ref", required=True, help="reference translations, one per line")
    parser.add_argument("--tgt-lang", default="de", help="target language for Moses tokenization (default de)")
    parser.add_argument("--output", help="also write the translations to this file")
    parser.add_argument("--progress", action="store_true", help="progress bar on stderr")
    parser.set_defaults(func=run)


def run(args):
    from keras_transformer.inference.evaluation import corpus_scores

    with open(args.src, encoding="utf-8") as f:
        sources = [line.rstrip("\n") for line in f]
    with open(args.ref, encoding="utf-8") as f:
        references = [line.rstrip("\n") for line in f]
    if len(sources) != len(references):
        raise SystemExit(f"evaluate: {args.src} has {len(sources)} lines but {args.ref} has {len(references)}.")
    translator = load_translator(args)
    hypotheses = translator.translate(sources, batch_size=args.batch_size, progress=args.progress)
    result = corpus_scores(hypotheses, references, lang=args.tgt_lang)
    result.update(model=args.model, sentences=len(sources))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write("\n".join(hypotheses) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0
