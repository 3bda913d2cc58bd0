"""The decoding flags that translate, evaluate, attention and export share (§6.1 defaults), and model loading."""

import argparse
import contextlib
import os

from keras_transformer.cli.errors import CommandError
from keras_transformer.cli.model_flag import add_models_flags, ensemble_paths, ensemble_translator_from_args
from keras_transformer.cli.startup import native_logs_silenced
from keras_transformer.cli.threads import set_pools_for
from keras_transformer.decoding.defaults import (
    DEFAULT_ALPHA,
    DEFAULT_BEAM_SIZE,
    DEFAULT_EARLY_STOPPING,
    DEFAULT_LENGTH_PENALTY,
    DEFAULT_TRANSLATE_BATCH_SIZE,
    DEFAULT_TRANSLATE_WORKERS,
    EARLY_STOPPING,
    EXTRA_OUTPUT_LENGTH,
    LENGTH_PENALTIES,
)
from keras_transformer.errors import ParameterError
from keras_transformer.inference.precision import DECODING_PRECISION_CHOICES


def add_search_options(parser, early_stopping=True, keep_recorded=False, ngram_blocking=True, length_penalty=True):
    """--beam, --alpha, --max-extra-length (and --early-stopping, --no-repeat-ngram-size, --length-penalty).

    `keep_recorded`: the flags default to None, which the command resolves
    (export: an exported version's own options, §6.1's for a run).
    """
    recorded = " for a run; an exported version's own when re-exporting" if keep_recorded else ""

    def default(value):
        return None if keep_recorded else value

    parser.add_argument(
        "--beam",
        type=int,
        default=default(DEFAULT_BEAM_SIZE),
        help=f"beam size (1 = greedy); default {DEFAULT_BEAM_SIZE} (§6.1){recorded}",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=default(DEFAULT_ALPHA),
        help=f"length penalty; default {DEFAULT_ALPHA} (§6.1){recorded}",
    )
    parser.add_argument(
        "--max-extra-length",
        type=int,
        default=default(EXTRA_OUTPUT_LENGTH),
        help=f"output may exceed the source by this many tokens; default {EXTRA_OUTPUT_LENGTH} (§6.1){recorded}",
    )
    if early_stopping:
        parser.add_argument(
            "--early-stopping",
            choices=EARLY_STOPPING,
            default=default(DEFAULT_EARLY_STOPPING),
            help=f"exact: stop when no alive hypothesis can win (default{recorded}); "
            "k_finished: stop once beam-size hypotheses ended (faster)",
        )
    if length_penalty:
        parser.add_argument(
            "--length-penalty",
            choices=LENGTH_PENALTIES,
            default=default(DEFAULT_LENGTH_PENALTY),
            help=f"gnmt: log P / ((5 + length) / 6) ** alpha (default, §6.1{recorded}); average: log P / "
            "length ** alpha, as fairseq's --lenpen and CTranslate2's length_penalty (e.g. --length-penalty "
            "average --alpha 1.0 for a fairseq recipe)",
        )
    if ngram_blocking:
        parser.add_argument(
            "--no-repeat-ngram-size",
            type=int,
            default=default(0),
            metavar="N",
            help="never repeat an N-gram of subwords within a translation (n-gram blocking, as fairseq's and "
            f"CTranslate2's no_repeat_ngram_size; not in the paper); default 0: off{recorded}",
        )


def add_model_options(parser):
    """--model (repeated: an ensemble) and --weights, the search options, --precision and --batch-size of translate
    and evaluate."""
    add_models_flags(
        parser, "run directory or exported SavedModel (its base directory, for its highest version, or one version)"
    )
    add_search_options(parser)
    parser.add_argument(
        "--precision",
        choices=DECODING_PRECISION_CHOICES,
        default=None,
        help="with a run directory: decode in this precision (default: the final model's own, float32, "
        "whatever the training precision; auto: bfloat16 where the hardware computes it natively, else float32)",
    )
    parser.add_argument(
        "--checkpoint",
        default=None,
        help="with a run directory: use this checkpoint (a path, e.g. from average-checkpoints, "
        "or 'latest') instead of model.keras (default: model.keras)",
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_TRANSLATE_BATCH_SIZE,
        help=f"the most sentences per decoding call (default {DEFAULT_TRANSLATE_BATCH_SIZE})",
    )
    parser.add_argument(
        "--trust-model",
        action="store_true",
        help="load a SavedModel whose graph reads or writes files or runs Python (default: refused; a "
        "keras-transformer export holds none of those ops)",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar on stderr (default: on, but for sentences given as arguments)",
    )


def translator_from_args(args):
    """The translator the options describe; a missing model or a refused option is a `CommandError`.

    First gives each of the batches `Translator.translate` keeps in flight its
    share of the cores (`cli.threads`), before TensorFlow starts.
    """
    set_pools_for(DEFAULT_TRANSLATE_WORKERS)
    from keras_transformer.inference.litert import is_litert_file

    if not (os.path.isdir(args.model) or is_litert_file(args.model)):
        raise CommandError(
            f"--model {args.model}: no such directory or .tflite file (expected a run directory, a SavedModel "
            "or a LiteRT file)."
        )
    from keras_transformer.inference.loading import load_translator

    sampling = None
    top_k, temperature = getattr(args, "sampling_topk", None), getattr(args, "sampling_temperature", None)
    if top_k is not None or temperature is not None:
        # `is None`, not `or`: 0 is a value to check, not a flag left out.
        sampling = dict(
            top_k=0 if top_k is None else top_k, temperature=1.0 if temperature is None else temperature, seed=args.seed
        )
    if not args.trust_model:
        for path in args.models:
            refuse_unsafe_saved_model(path)
    alignment_layer = getattr(args, "alignment_layer", None)  # translate's
    if ensemble_paths(args.models, args.weights):
        return ensemble_translator_from_args(args, sampling, alignment_layer)
    with _loading_errors(args.model):
        return load_translator(
            args.model,
            args.beam,
            args.alpha,
            args.max_extra_length,
            args.early_stopping,
            args.precision,
            checkpoint=args.checkpoint,
            sampling=sampling,
            no_repeat_ngram_size=args.no_repeat_ngram_size,
            alignment_layer=alignment_layer,
            length_penalty=args.length_penalty,
        )


def refuse_unsafe_saved_model(path):
    """Refuses the SavedModel at `path` (a run directory passes) if its graph touches files or runs Python.

    Raises:
        CommandError: naming the ops found (`inference.export_dirs.unsafe_ops`) and `--trust-model`.
    """
    from keras_transformer.inference.export_dirs import unsafe_ops
    from keras_transformer.inference.translator import is_saved_model, resolve_saved_model_dir

    if not is_saved_model(path):
        return
    found = unsafe_ops(resolve_saved_model_dir(path))
    if found:
        shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        raise CommandError(
            f"--model {path}: its graph holds {shown}: ops that read or write files or run Python; "
            "refused; give --trust-model to run it anyway."
        )


def run_translator_from_args(args, **options):
    """A `Translator` of the training run directory `args.model` (score, attention), or a `CommandError`."""
    from keras_transformer.inference.translator import Translator

    if not os.path.isdir(args.model):
        raise CommandError(f"--model {args.model}: no such directory (expected a training run directory).")
    with _loading_errors(args.model):
        return Translator.from_run_dir(args.model, **options)


@contextlib.contextmanager
def _loading_errors(path):
    """A `CommandError` (one line) instead of a traceback when the model at `path` cannot be loaded.

    The C++ logging of the loading (SentencePiece's) is silenced (`startup.native_logs_silenced`).
    """
    import tensorflow as tf

    try:
        with native_logs_silenced():
            yield
    except ParameterError:
        raise  # named by its flag (`cli.main`)
    except (FileNotFoundError, ValueError) as error:
        raise CommandError(str(error)) from None
    except tf.errors.NotFoundError as error:  # e.g. a directory without the run's spm.model
        raise CommandError(f"--model {path}: {error.message}") from None
