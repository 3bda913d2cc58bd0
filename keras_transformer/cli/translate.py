"""`keras-transformer translate`: one translation per input line on stdout (progress on stderr)."""

import sys

from keras_transformer.cli.decoding_options import add_model_options, load_translator


def register(subparsers):
    parser = subparsers.add_parser(
        "translate", help="translate sentences (arguments, a file, or stdin; one per line)",
        description="Writes one translation per input line to stdout (an empty line for an empty input); "
                    "a progress bar goes to stderr.",
    )
    add_model_options(parser)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read --input or stdin)")
    parser.add_argument("--input", help="file with one sentence per line ('-' for stdin)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.set_defaults(func=run)


def read_sentences(args):
    if args.sentences:
        return list(args.sentences)
    if args.input and args.input != "-":
        with open(args.input, encoding="utf-8", errors="replace") as f:
            return [line.rstrip("\n") for line in f]
    return [line.rstrip("\n") for line in sys.stdin]


def run(args):
    translator = load_translator(args)
    sentences = read_sentences(args)
    translations = translator.translate(sentences, batch_size=args.batch_size,
                                        progress=not args.sentences and not args.quiet)
    for line in translations:
        sys.stdout.write(line.replace("\n", " ") + "\n")
    sys.stdout.flush()
    return 0
