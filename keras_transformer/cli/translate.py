"""`keras-transformer translate`: one translation per input line on stdout (progress on stderr)."""

import sys

from keras_transformer.cli.decoding_options import add_model_options, translator_from_args
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.text_files import read_lines, read_stdin_lines
from keras_transformer.errors import ParameterError


def register(subparsers):
    parser = subparsers.add_parser(
        "translate",
        help="translate sentences (arguments, a file, or stdin; one per line)",
        description="Writes one translation per input line to stdout (an empty line for an empty input); "
        "a progress bar goes to stderr.",
    )
    add_model_options(parser)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read --input or stdin)")
    parser.add_argument("--input", help="file with one sentence per line ('-' for stdin)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    parser.add_argument(
        "--n-best",
        type=int,
        default=None,
        metavar="N",
        help="the N best translations of each input (N <= --beam), one per line as "
        "SOURCE_INDEX<TAB>SCORE<TAB>TRANSLATION (0-based index, best first)",
    )
    sampling = parser.add_argument_group("sampling (instead of beam search; back-translation, data augmentation)")
    sampling.add_argument(
        "--sampling-topk",
        type=int,
        default=None,
        metavar="K",
        help="draw each token from the K most probable (0: the whole vocabulary)",
    )
    sampling.add_argument(
        "--sampling-temperature",
        type=float,
        default=None,
        metavar="T",
        help="divide the logits by T before drawing (default 1)",
    )
    sampling.add_argument("--seed", type=int, default=None, help="makes the draws reproducible")
    parser.set_defaults(func=run)


def read_sentences(args):
    if args.sentences:
        return list(args.sentences)
    if args.input and args.input != "-":
        return read_lines(args.input, "--input")
    return read_stdin_lines()


def run(args):
    if args.sentences and args.input:
        raise CommandError("give sentences as arguments or --input, not both.")
    translator = translator_from_args(args)
    sentences = read_sentences(args)
    try:
        translations = translator.translate(
            sentences, batch_size=args.batch_size, progress=not args.sentences and not args.quiet, n_best=args.n_best
        )
    except ParameterError:
        raise  # named by its flag (`cli.main`)
    except ValueError as error:  # an option the model refuses: --batch-size
        raise CommandError(str(error)) from None
    for index, result in enumerate(translations):
        if args.n_best is None:
            sys.stdout.write(result.replace("\n", " ") + "\n")
            continue
        for text, score in result:
            sys.stdout.write(f"{index}\t{score:.6f}\t{text.replace(chr(10), ' ')}\n")
    sys.stdout.flush()
    return 0
