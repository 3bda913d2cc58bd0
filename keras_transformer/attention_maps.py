"""Attention maps, as in the paper's Figures 3-5 (Vaswani et al., 2017, appendix).

`keras-transformer attention --model RUN_DIR "a sentence"` translates the
sentence, reruns the model on the source and its translation with
`return_attention_scores`, and draws one layer's heads of the encoder
self-attention, the decoder self-attention and the encoder-decoder
attention, with the subword tokens on the axes.
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only; no display needed
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from keras_transformer.tokenizer import BOS_ID  # noqa: E402


def attention_weights(translator, sentence, layer=-1):
    """Weights of one layer for `sentence` and its translation.

    Returns a dict with `source_tokens`, `target_tokens` (decoder inputs:
    start token, then the translation), and `[heads, rows, cols]` arrays
    `encoder`, `decoder`, `cross`.
    """
    model, tokenizer = translator.model, translator.tokenizer
    source_ids = translator.source_ids(tf.constant([sentence]))
    output_ids, _ = translator._decode(source_ids)
    output_ids = output_ids.numpy()[0]
    output_ids = output_ids[output_ids != 0]
    target_in = np.concatenate([[BOS_ID], output_ids[:-1] if len(output_ids) else []]).astype("int32")[None]
    memory, encoder_weights = model.encode(source_ids, return_attention_scores=True)
    _, decoder_weights = model.decode(target_in, memory, source_ids, return_attention_scores=True)
    return {
        "source_tokens": tokenizer.pieces(source_ids.numpy()[0]),
        "target_tokens": tokenizer.pieces(target_in[0]),
        "output_tokens": tokenizer.pieces(output_ids),
        "translation": tokenizer.detokenize(output_ids[None]).numpy()[0].decode("utf-8"),
        "encoder": np.asarray(encoder_weights[layer])[0],
        "decoder": np.asarray(decoder_weights["self"][layer])[0],
        "cross": np.asarray(decoder_weights["cross"][layer])[0],
    }


def plot_attention(weights, path, layer_label="last layer"):
    """Draws a 3 x h grid of heatmaps (rows: encoder, decoder, cross) into `path` (PNG)."""
    heads = weights["encoder"].shape[0]
    rows = [
        ("encoder self-attention", weights["encoder"], weights["source_tokens"], weights["source_tokens"]),
        ("decoder self-attention", weights["decoder"], weights["target_tokens"], weights["target_tokens"]),
        ("encoder-decoder attention", weights["cross"], weights["target_tokens"], weights["source_tokens"]),
    ]
    size = max(len(weights["source_tokens"]), len(weights["target_tokens"]))
    cell = max(2.5, 0.28 * size)
    figure, axes = plt.subplots(3, heads, figsize=(cell * heads, cell * 3 + 1), squeeze=False)
    for r, (title, matrix, y_tokens, x_tokens) in enumerate(rows):
        for h in range(heads):
            axis = axes[r][h]
            axis.imshow(matrix[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axis.set_xticks(range(len(x_tokens)), x_tokens, rotation=90, fontsize=7)
            axis.set_yticks(range(len(y_tokens)), y_tokens, fontsize=7)
            axis.set_title(f"{title}, head {h + 1}", fontsize=8)
    figure.suptitle(f"Attention weights, {layer_label}: " + " ".join(weights["output_tokens"]), fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def run_attention(args):
    from keras_transformer.translator import Translator, is_saved_model

    if is_saved_model(args.model):
        raise SystemExit(
            f"attention: {args.model} is an exported SavedModel, which does not expose attention weights; "
            "give the training run directory."
        )
    translator = Translator.from_run_dir(args.model, beam_size=args.beam, alpha=args.alpha)
    num_layers = translator.model.config.num_layers
    if not -num_layers <= args.layer < num_layers:
        raise SystemExit(f"attention: --layer {args.layer} is out of range for {num_layers} layers.")
    weights = attention_weights(translator, args.sentence, layer=args.layer)
    layer_number = args.layer % num_layers + 1
    output = args.output or os.path.join(args.model, f"attention_layer{layer_number}.png")
    plot_attention(weights, output, layer_label=f"layer {layer_number} of {num_layers}")
    print("translation:", weights["translation"])
    print(f"wrote {output}")
    return 0


def register_commands(subparsers):
    parser = subparsers.add_parser(
        "attention", help="plot the attention heads of one layer for a sentence (PNG)",
    )
    parser.add_argument("sentence", help="the source sentence")
    parser.add_argument("--model", required=True, help="training run directory")
    parser.add_argument("--layer", type=int, default=-1, help="layer index (default -1: the last)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--alpha", type=float, default=0.6)
    parser.add_argument("--output", help="PNG path (default RUN_DIR/attention_layerN.png)")
    parser.set_defaults(func=run_attention)
