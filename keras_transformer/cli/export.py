"""`keras-transformer export`: a SavedModel for TensorFlow Serving, or a LiteRT file (strings in, translations out)."""

import sys

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.decoding_options import add_search_options
from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.model_flag import add_model_flag, ensemble_paths, model_paths
from keras_transformer.cli.startup import native_logs_silenced
from keras_transformer.cli.text_files import read_lines
from keras_transformer.errors import ParameterError
from keras_transformer.inference.precision import DECODING_PRECISION_CHOICES

# What `export` computes a run's model in unless --precision says otherwise: train's default.
RUN_EXPORT_PRECISION = "float32"


def register(subparsers):
    parser = subparsers.add_parser(
        "export",
        help=COMMAND_HELP["export"],
        description="Writes OUTPUT/<version>/ (saved_model.pb, variables/, assets/spm.model, assets/export.json, "
        "assets.extra/tf_serving_warmup_requests) "
        "with a 'serving_default' signature: inputs tf.string [None] -> translations tf.string [None], "
        "scores float32 [None]. Prints the version directory. Given an exported version instead of a "
        "run, writes its model again with this version's graph (its decoding options, precision, "
        "training options, --n-best signature and scores kept unless given; the scores only while "
        "the options and precision stay). Given several models (--model A --model B, or A B), writes one "
        "SavedModel of their ensemble, which averages their log-probabilities at every step. With "
        "--format litert, writes one LiteRT file instead (OUTPUT, e.g. model.tflite, and OUTPUT.json): the "
        "tokenizer, the model and the beam search, for phones and edge devices (docs/litert.md).",
    )
    add_model_flag(
        parser,
        "training run directory, or an exported version directory (OUTPUT/<version>) to re-export",
        ensemble=True,
    )
    parser.add_argument(
        "--output", "-o", required=True, help="model base directory, e.g. saved_models/multi30k_en_de (required)"
    )
    parser.add_argument(
        "--version", type=int, default=None, help="version number (default: highest existing + 1, starting at 1)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --version")
    _add_format_flags(parser)
    add_search_options(parser, keep_recorded=True)
    parser.add_argument(
        "--max-input-length",
        type=int,
        default=None,
        help="longer sources are truncated to this many tokens (default: the model's max_length; "
        "an export's recorded one)",
    )
    parser.add_argument(
        "--max-input-bytes",
        type=int,
        default=None,
        help="a request's sentence is cut to this many bytes before it is tokenized, bounding its cost "
        "(default: 64 per token of --max-input-length; an export's recorded one)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="export this checkpoint (path or 'latest') instead of the final model.keras (default: model.keras)",
    )
    parser.add_argument(
        "--n-best",
        type=int,
        default=None,
        metavar="N",
        help="also export the signature translate_n_best: the N best translations and scores "
        "of each input, [B, N] (N <= --beam; 0: none, also for an export that has one; default: none "
        "for a run, an export's own)",
    )
    parser.add_argument(
        "--alignment-layer",
        type=int,
        default=None,
        metavar="N",
        help="the decoder layer whose attention the signature translate_with_alignments aligns with, 0-based, "
        "negative from the last (default: -1, the last, for a run; an export's own)",
    )
    parser.add_argument(
        "--precision",
        choices=DECODING_PRECISION_CHOICES,
        default=None,
        help=f"the precision the exported graph computes in (printed on stderr). Default for a run: "
        f"{RUN_EXPORT_PRECISION}, as train's default: the same answers on every machine, and a graph "
        "that serves on any CPU; a re-exported version keeps its own. auto: bfloat16 where this "
        "machine computes it natively (a CPU with AVX512_BF16 or AMX-BF16, GPUs of compute "
        "capability 8.0+), else float32 (mixed_float16 on older tensor-core GPUs): faster, but this "
        "machine's choice, slow to serve on CPUs without native bfloat16",
    )
    _add_warmup_flags(parser)
    parser.set_defaults(func=run)


def _add_format_flags(parser):
    """--format and --quantize: a SavedModel (the default) or a LiteRT file."""
    parser.add_argument(
        "--format",
        choices=("savedmodel", "litert"),
        default="savedmodel",
        help="savedmodel: OUTPUT/<version>/ for TensorFlow Serving; litert: one .tflite file OUTPUT that "
        "LiteRT (TFLite) runs, float32 (default %(default)s)",
    )
    parser.add_argument(
        "--quantize",
        choices=("int8",),
        default=None,
        help="with --format litert: int8 weights (dynamic-range quantization, about a quarter of the size; "
        "default: float32 weights)",
    )


def _add_warmup_flags(parser):
    """--warmup-sentences or --no-warmup: the requests TensorFlow Serving replays when it loads a version."""
    warmup = parser.add_mutually_exclusive_group()
    warmup.add_argument(
        "--warmup-sentences",
        metavar="FILE",
        default=None,
        help="source sentences, one per line, for the warm-up requests TensorFlow Serving replays "
        "when it loads the version (assets.extra/tf_serving_warmup_requests: requests of 1, 8, "
        "64 and 256 sentences). Default: a re-exported version's own, else the first "
        "validation sources of the run's data where they can be read, else none",
    )
    warmup.add_argument("--no-warmup", action="store_true", help="write no warm-up requests")


def _warmup_sentences(args):
    """`export_saved_model`'s `warmup_sentences` for the flags: "auto", None, or the lines of the file."""
    if args.no_warmup:
        return None
    if args.warmup_sentences is None:
        return "auto"
    sentences = [line for line in read_lines(args.warmup_sentences, "--warmup-sentences") if line]
    if not sentences:
        raise CommandError(f"--warmup-sentences {args.warmup_sentences} has no sentences.")
    return sentences


def run(args):
    from keras_transformer.inference.export_dirs import is_export_dir, read_export_info

    sources = model_paths(args)
    ensemble = ensemble_paths(sources, args.weights)
    warmup_sentences = _warmup_sentences(args)
    precision = args.precision
    if precision is None and not (len(sources) == 1 and is_export_dir(sources[0])):
        precision = RUN_EXPORT_PRECISION
    options = dict(
        version=args.version,
        beam_size=args.beam,
        alpha=args.alpha,
        max_extra_length=args.max_extra_length,
        overwrite=args.overwrite,
        max_input_length=args.max_input_length,
        max_input_bytes=args.max_input_bytes,
        early_stopping=args.early_stopping,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        length_penalty=args.length_penalty,
        alignment_layer=args.alignment_layer,
        dtype=precision,
        n_best=args.n_best,
        warmup_sentences=warmup_sentences,
    )
    if args.format == "litert":
        return _export_litert(sources, ensemble, args, options)
    if args.quantize is not None:
        raise CommandError(f"--quantize {args.quantize}: needs --format litert.")
    try:
        with native_logs_silenced():
            path = _export(sources, ensemble, args, options)
    except ParameterError as error:
        if error.parameter == "models":  # an ensemble's different vocabularies, named by the message
            raise CommandError(f"--model: {error.message}") from None
        raise  # named by its flag (`cli.main`)
    except FileExistsError as error:
        raise CommandError(f"{error} (--version, --overwrite)") from None
    except (FileNotFoundError, ImportError, ValueError) as error:
        raise CommandError(str(error)) from None
    info = read_export_info(path)
    reason = info.get("precision_choice")
    print(f"precision: {info['precision']}" + (f" ({reason})" if reason else ""), file=sys.stderr, flush=True)
    print(path)
    return 0


def _export(sources, ensemble, args, options):
    """Exports the one model of `sources`, or the ensemble of them; returns the version directory."""
    if not ensemble:
        from keras_transformer.inference.saved_model import export_saved_model

        return export_saved_model(sources[0], args.output, checkpoint=args.checkpoint, **options)
    if args.checkpoint is not None:
        raise CommandError(f"--checkpoint {args.checkpoint}: applies to one --model, not to an ensemble.")
    from keras_transformer.inference.ensembles import export_ensemble

    return export_ensemble(ensemble, args.output, weights=args.weights, **options)


def _export_litert(sources, ensemble, args, options):
    """`--format litert`: one `.tflite` file of the one model of `sources`, with the search options given."""
    from keras_transformer.inference.export_sources import DecodingOptions
    from keras_transformer.inference.litert import export_litert

    refused = [
        (ensemble, "--model given more than once: an ensemble"),
        (args.n_best is not None, f"--n-best {args.n_best}"),
        (args.alignment_layer is not None, f"--alignment-layer {args.alignment_layer}"),
        (args.version is not None, f"--version {args.version}"),
        (args.warmup_sentences is not None or args.no_warmup, "--warmup-sentences/--no-warmup"),
        (args.precision not in (None, "auto", "float32"), f"--precision {args.precision}"),
    ]
    for given, flag in refused:
        if given:
            raise CommandError(f"{flag}: not for --format litert (one float32 file, beam search, no versions).")
    names = ("beam_size", "alpha", "max_extra_length", "max_input_length", "max_input_bytes", "early_stopping")
    names += ("no_repeat_ngram_size", "length_penalty")
    decoding = DecodingOptions(**{name: options[name] for name in names})
    try:
        with native_logs_silenced():
            path = export_litert(
                sources[0],
                args.output,
                decoding,
                checkpoint=args.checkpoint,
                quantize=args.quantize,
                overwrite=args.overwrite,
            )
    except ParameterError as error:
        if error.parameter == "output_path":
            raise CommandError(f"--output {args.output}: {error.message}") from None
        raise
    except FileExistsError as error:
        raise CommandError(f"{error} (--overwrite)") from None
    except (FileNotFoundError, ImportError, ValueError) as error:
        raise CommandError(str(error)) from None
    weights = "int8 weights" if args.quantize else "float32"
    print(f"precision: {weights} (LiteRT)", file=sys.stderr, flush=True)
    print(path)
    return 0
