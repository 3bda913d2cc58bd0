"""`keras-transformer translate`: one translation per input line on stdout (progress on stderr)."""

import argparse
import sys

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.decoding_options import add_model_options, translator_from_args
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.startup import native_logs_silenced
from keras_transformer.cli.text_files import read_lines, read_stdin_lines
from keras_transformer.errors import ParameterError


def register(subparsers):
    parser = subparsers.add_parser(
        "translate",
        help=COMMAND_HELP["translate"],
        description="Writes one translation per input line to stdout (an empty line for an empty input), "
        "in input order as they are decoded: a reader of the output sees it grow, and Ctrl-C keeps "
        "what was written. A progress bar, and the inputs longer than the model reads (translated "
        "from their beginning), go to stderr.",
    )
    add_model_options(parser)
    parser.add_argument("sentences", nargs="*", help="sentences to translate (default: read --input or stdin)")
    parser.add_argument("--input", help="file with one sentence per line ('-' for stdin; default: stdin)")
    parser.add_argument(
        "--quiet", dest="progress", action="store_false", default=None, help=argparse.SUPPRESS
    )  # --no-progress
    parser.add_argument(
        "--n-best",
        type=int,
        default=None,
        metavar="N",
        help="the N best translations of each input (N <= --beam), one per line as "
        "SOURCE_INDEX<TAB>SCORE<TAB>TRANSLATION (0-based index, best first; default: the best only, "
        "without index and score)",
    )
    parser.add_argument(
        "--target-prefix",
        default=None,
        metavar="FILE",
        help="a file ('-' for stdin) with one target prefix per input, line N for input N (an empty line for "
        "none): each translation starts with its prefix, and the search continues it (interactive "
        "translation, terminology; not in the paper). Its subwords are forced as SentencePiece splits it, so "
        "a prefix that ends inside a word forces that fragment's subwords. Not with a LiteRT file, nor with "
        "--n-best and a SavedModel. Default: none, free decoding",
    )
    parser.add_argument(
        "--alignments",
        action="store_true",
        help="also print each translation's word alignment with its input, after ' ||| ' (after each of the "
        "--n-best translations too), in Pharaoh format: i-j for each target word j, i the source word it is "
        "aligned with, both 0-based, words as split at spaces; from the encoder-decoder attention of one decoder "
        "layer averaged over its heads (fairseq's --print-alignment; not in the paper). E.g. translate "
        "--alignments 'A dog runs.' prints 'Ein Hund rennt. ||| 0-0 1-1 2-2'. Not with a LiteRT file, nor with "
        "--n-best or --target-prefix and a SavedModel",
    )
    parser.add_argument(
        "--alignment-layer",
        type=int,
        default=None,
        metavar="N",
        help="with --alignments: the decoder layer whose attention aligns, 0-based, negative from the last "
        "(default -1, the last, as fairseq's; a SavedModel aligns with the one it was exported with)",
    )
    sampling = parser.add_argument_group("sampling (instead of beam search; back-translation, data augmentation)")
    sampling.add_argument(
        "--sampling-topk",
        type=int,
        default=None,
        metavar="K",
        help="draw each token from the K most probable (0: the whole vocabulary; default: beam search, no sampling)",
    )
    sampling.add_argument(
        "--sampling-temperature",
        type=float,
        default=None,
        metavar="T",
        help="divide the logits by T before drawing (default 1)",
    )
    sampling.add_argument(
        "--seed", type=int, default=None, help="makes the draws reproducible (default: other draws each run)"
    )
    parser.set_defaults(func=run)


def read_sentences(args):
    if args.sentences:
        return list(args.sentences)
    if args.input and args.input != "-":
        return read_lines(args.input, "--input")
    return read_stdin_lines()


def read_target_prefixes(args, sentences):
    """The lines of `--target-prefix FILE`, one per input sentence; None without the flag."""
    if args.target_prefix is None:
        return None
    if args.target_prefix != "-":
        prefixes = read_lines(args.target_prefix, "--target-prefix")
    else:
        prefixes = read_stdin_lines()
    if len(prefixes) != len(sentences):
        inputs = "sentences given" if args.sentences else "input lines"
        raise CommandError(
            f"--target-prefix {args.target_prefix}: {len(prefixes)} lines for {len(sentences)} {inputs} "
            "(one prefix per input; an empty line for none)."
        )
    return prefixes


def run(args):
    if args.sentences and args.input:
        raise CommandError("give sentences as arguments or --input, not both.")
    if args.target_prefix == "-" and not args.sentences and args.input in (None, "-"):
        raise CommandError("--target-prefix -: standard input holds the sentences; give the prefixes in a file.")
    if args.n_best is not None and (args.sampling_topk is not None or args.sampling_temperature is not None):
        sampling = "--sampling-topk" if args.sampling_topk is not None else "--sampling-temperature"
        raise CommandError(f"--n-best {args.n_best}: needs beam search, not sampling ({sampling}).")
    if args.alignment_layer is not None and not args.alignments:
        raise CommandError(f"--alignment-layer {args.alignment_layer}: needs --alignments.")
    translator = translator_from_args(args)
    refuse_saved_model_alignments(args, translator)
    sentences = read_sentences(args)
    prefixes = read_target_prefixes(args, sentences)
    from keras_transformer.inference.batching import translate_stream, truncated_sentences

    with native_logs_silenced():  # a SavedModel's vocabulary is read here
        truncated = truncated_sentences(translator, sentences)
    report_truncated(args, truncated, translator)
    results = translate_stream(
        translator,
        sentences,
        batch_size=args.batch_size,
        progress=not args.sentences if args.progress is None else args.progress,
        n_best=args.n_best,
        target_prefixes=prefixes,
        alignments=args.alignments,
    )
    try:
        for index, result in enumerate(results):
            write_result(index, result, args.n_best)
    except ParameterError:
        raise  # named by its flag (`cli.main`)
    except ValueError as error:  # an option the model refuses
        raise CommandError(str(error)) from None
    finally:  # stopped (Ctrl-C, a closed pipe): the progress bar's line ends before the error's
        results.close()
    return 0


def refuse_saved_model_alignments(args, translator):
    """Refuses --alignments with --n-best or --target-prefix for a SavedModel, which has no signature for both."""
    from keras_transformer.inference.saved_model_translator import SavedModelTranslator

    if not args.alignments or not isinstance(translator, SavedModelTranslator):
        return
    for given, flag in ((args.n_best, "--n-best"), (args.target_prefix, "--target-prefix")):
        if given is not None:
            raise CommandError(
                f"--alignments with {flag} {given}: {args.model} is a SavedModel, which has no signature for both "
                "(a run directory has)."
            )


def write_result(index, result, n_best):
    """Writes (and flushes) the translation of input `index` (" ||| " and its alignment, if given), or its n-best
    lines, to stdout."""
    rows = [result] if n_best is None else result
    for text, score, *alignment in rows:
        line = text.replace("\n", " ") + "".join(f" ||| {a}" for a in alignment)
        sys.stdout.write(line + "\n" if n_best is None else f"{index}\t{score:.6f}\t{line}\n")
    sys.stdout.flush()


# At most this many truncated inputs are named one by one; the rest are counted.
MAX_TRUNCATED_REPORTED = 10


def report_truncated(args, truncated, translator):
    """Says on stderr which inputs are longer than the model reads, and so are translated from their beginning."""
    if not truncated:
        return
    where = "sentence" if args.sentences else f"{args.input if args.input and args.input != '-' else '<stdin>'} line"
    length, max_bytes = translator.max_input_length, translator.max_input_bytes
    for index, pieces, size in truncated[:MAX_TRUNCATED_REPORTED]:
        if size is None:
            what = f"{pieces} subwords, translated from its first {length - 1}"
        else:
            what = (
                f"{size} bytes, translated from its first {max_bytes} bytes' first {min(pieces, length - 1)} subwords"
            )
        limits = f"{length} tokens, {max_bytes} bytes," if max_bytes else f"{length} tokens"
        print(
            f"keras-transformer translate: warning: {where} {index + 1}: {what} (the model reads at most "
            f"{limits} of a sentence).",
            file=sys.stderr,
        )
    if len(truncated) > MAX_TRUNCATED_REPORTED:
        print(
            f"keras-transformer translate: warning: {len(truncated) - MAX_TRUNCATED_REPORTED} more inputs truncated.",
            file=sys.stderr,
        )
    sys.stderr.flush()
