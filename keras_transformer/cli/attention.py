"""`keras-transformer attention`: the attention heads of one layer for a sentence, as a PNG."""

import os

from keras_transformer.cli.commands import COMMAND_HELP
from keras_transformer.cli.decoding_options import add_search_options, run_translator_from_args
from keras_transformer.cli.errors import CommandError


def register(subparsers):
    parser = subparsers.add_parser(
        "attention",
        help=COMMAND_HELP["attention"],
        description="Translates SENTENCE with the run --model and draws, for one layer, the "
        "encoder self-attention, decoder self-attention and encoder-decoder attention of each head "
        "(§3.2.3; the paper's Figures 3-5) in one PNG. Prints the translation and the file written.",
    )
    parser.add_argument("sentence", help="the source sentence")
    parser.add_argument("--model", required=True, help="training run directory (required)")
    parser.add_argument("--layer", type=int, default=-1, help="layer index (default -1: the last)")
    add_search_options(parser, early_stopping=False, ngram_blocking=False, length_penalty=False)
    parser.add_argument("--output", help="PNG path (default: attention_layerN.png in the run directory)")
    parser.set_defaults(func=run)


def run(args):
    from keras_transformer.inference.attention_maps import attention_weights, is_blank, plot_attention
    from keras_transformer.inference.translator import is_saved_model

    if is_saved_model(args.model):
        raise CommandError(
            f"{args.model} is an exported SavedModel, which does not expose attention weights; "
            "give the training run directory."
        )
    if is_blank(args.sentence):  # checked before the model loads
        raise CommandError("nothing to show: the sentence is blank (it translates to an empty string).")
    translator = run_translator_from_args(
        args, beam_size=args.beam, alpha=args.alpha, max_extra_length=args.max_extra_length
    )
    num_layers = translator.model.config.num_layers
    if not -num_layers <= args.layer < num_layers:
        raise CommandError(f"--layer {args.layer} is out of range for {num_layers} layers.")
    weights = attention_weights(translator, args.sentence, layer=args.layer)
    layer_number = args.layer % num_layers + 1
    output = args.output or os.path.join(args.model, f"attention_layer{layer_number}.png")
    plot_attention(weights, output, layer_label=f"layer {layer_number} of {num_layers}")
    print("translation:", weights["translation"])
    print(f"wrote {output}")
    return 0
