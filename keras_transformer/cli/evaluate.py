"""`keras-transformer evaluate`: corpus sacreBLEU, chrF and lower-cased tokenized BLEU, as JSON."""

import json

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.decoding_options import add_model_options, translator_from_args
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.text_files import read_lines
from keras_transformer.errors import ParameterError


def register(subparsers):
    parser = subparsers.add_parser(
        "evaluate",
        help=COMMAND_HELP["evaluate"],
        description="Translates --src (or a shipped Multi30k split) with --model and prints, as JSON on "
        "stdout, the corpus sacreBLEU and chrF against --ref and the lower-cased tokenized BLEU that "
        "Multi30k papers report, with their sacreBLEU signatures; a progress bar goes to stderr.",
    )
    add_model_options(parser)
    parser.add_argument("--src", help="source sentences, one per line (required without --multi30k)")
    parser.add_argument("--ref", help="reference translations, one per line (required without --multi30k)")
    parser.add_argument(
        "--multi30k",
        metavar="SPLIT",
        choices=("val", "test2016"),
        help="instead of --src/--ref: the shipped Multi30k split (val or test2016), from --src-lang to "
        "--tgt-lang (default: none, --src and --ref)",
    )
    parser.add_argument("--src-lang", default="en", help="source language of --multi30k (default en)")
    parser.add_argument(
        "--tgt-lang",
        default="de",
        help="target language: Moses tokenization, and the reference side of --multi30k (default de)",
    )
    parser.add_argument("--output", help="also write the translations to this file (default: none)")
    parser.set_defaults(func=run)


def run(args):
    from keras_transformer.inference.evaluation import corpus_scores

    if args.multi30k:
        if args.src or args.ref:
            raise CommandError("give --multi30k SPLIT or --src and --ref, not both.")
        from keras_transformer.data import corpora

        try:
            sources = corpora.read_lines(args.multi30k, args.src_lang)
            references = corpora.read_lines(args.multi30k, args.tgt_lang)
        except ValueError as error:
            raise CommandError(f"--multi30k {args.multi30k}: {error}") from None
    elif not (args.src and args.ref):
        raise CommandError("give --src and --ref (files), or --multi30k SPLIT.")
    else:
        sources, references = read_lines(args.src, "--src"), read_lines(args.ref, "--ref")
    if len(sources) != len(references):
        raise CommandError(f"{args.src} has {len(sources)} lines but {args.ref} has {len(references)}.")
    if not sources:  # checked before the model loads
        raise CommandError(f"{args.src} and {args.ref} have no sentences.")
    translator = translator_from_args(args)
    try:
        hypotheses = translator.translate(sources, batch_size=args.batch_size, progress=args.progress is not False)
    except ParameterError:
        raise  # named by its flag (`cli.main`)
    except ValueError as error:  # an option the model refuses: --batch-size
        raise CommandError(str(error)) from None
    result = corpus_scores(hypotheses, references, lang=args.tgt_lang)
    result.update(model=args.models if len(args.models) > 1 else args.model, sentences=len(sources))
    if len(args.models) > 1 and args.weights:
        result["weights"] = args.weights
    if args.multi30k:
        result["data"] = f"multi30k:{args.multi30k} {args.src_lang}->{args.tgt_lang}"
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write("\n".join(hypotheses) + "\n")
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0
