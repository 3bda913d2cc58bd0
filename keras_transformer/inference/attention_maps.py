"""Attention maps, as in the paper's Figures 3-5 (Vaswani et al., 2017, appendix).

`keras-transformer attention --model RUN_DIR "a sentence"` (or
`attention_weights` and `plot_attention`) translates the
sentence, reruns the model on the source and its translation
(`Transformer.attention_weights`), and draws one layer's heads of the encoder
self-attention, the decoder self-attention and the encoder-decoder
attention, with the subword tokens on the axes.

A blank sentence has nothing to show (the translator translates it to ""
without running the model): `attention_weights` refuses it. The figure is
at most `MAX_FIGURE_INCHES` a side at `DPI`, whatever the input's length or
the number of heads: longer inputs get smaller cells and fewer tick labels.
"""

import math

import numpy as np
import tensorflow as tf

from keras_transformer.special_ids import BOS_ID, PAD_ID

# 4000 x 4000 pixels at most (64 MB as RGBA). Uncapped, 0.28 inches a token and head made
# 16 heads x 220 tokens a 98,560 x 18,580-pixel figure: 7 GB, or matplotlib's size error.
MAX_FIGURE_INCHES = 40.0
DPI = 100
# Tick labels get smaller down to this size, then only every k-th token is labelled.
_SMALLEST_FONT = 4.0


def is_blank(sentence):
    """True if `sentence` is empty once normalized as `Translator` normalizes it (whitespace, a BOM)."""
    from keras_transformer.inference.translator import Translator

    return int(tf.strings.length(Translator.normalized(tf.constant([sentence])))[0]) == 0


def attention_weights(translator, sentence, layer=-1):
    """Weights of one layer for `sentence` and its translation.

    Returns a dict with `source_tokens`, `target_tokens` (decoder inputs:
    start token, then the translation), `output_tokens` (the translation's
    pieces, end token included), `translation` (its text), and
    `[heads, rows, cols]` arrays `encoder`, `decoder`, `cross`.

    Raises:
        ValueError: `sentence` is blank (`is_blank`): it translates to ""
            without the model, so there are no weights to show.
    """
    if is_blank(sentence):
        raise ValueError("nothing to show: the sentence is blank (it translates to an empty string).")
    model, tokenizer = translator.model, translator.tokenizer
    source_ids = translator.source_ids(tf.constant([sentence]))
    output_ids, _ = translator.search(source_ids)
    output_ids = output_ids.numpy()[0]
    output_ids = output_ids[output_ids != PAD_ID]
    target_in = np.concatenate([[BOS_ID], output_ids[:-1] if len(output_ids) else []]).astype("int32")[None]
    weights = model.attention_weights(source_ids, target_in)
    return {
        "source_tokens": tokenizer.pieces(source_ids.numpy()[0]),
        "target_tokens": tokenizer.pieces(target_in[0]),
        "output_tokens": tokenizer.pieces(output_ids),
        "translation": tokenizer.detokenize(output_ids[None]).numpy()[0].decode("utf-8"),
        "encoder": np.asarray(weights.encoder[layer])[0],
        "decoder": np.asarray(weights.decoder[layer])[0],
        "cross": np.asarray(weights.cross[layer])[0],
    }


def _cell_inches(heads, tokens):
    """Side of one heatmap: 0.28 inches a token (2.5 at least), shrunk so 3 x `heads` of them fit the cap."""
    return min(max(2.5, 0.28 * tokens), MAX_FIGURE_INCHES / heads, (MAX_FIGURE_INCHES - 1) / 3)


def _tick_labels(tokens, cell):
    """`(positions, labels, fontsize)`: every token while labels of `_SMALLEST_FONT` points fit, else every k-th."""
    points_per_token = 72 * cell * 0.7 / max(len(tokens), 1)  # the labels themselves take ~30% of the cell
    step = max(1, math.ceil(_SMALLEST_FONT / points_per_token))
    positions = range(0, len(tokens), step)
    return positions, [tokens[i] for i in positions], min(7.0, max(_SMALLEST_FONT, points_per_token))


def _title(text, width_inches, fontsize=9):
    """`text` cut to one line of the figure's width (about 0.6 em a character)."""
    fits = max(10, int(width_inches * 72 / (0.6 * fontsize)))
    return text if len(text) <= fits else text[: fits - 1] + "\u2026"


def plot_attention(weights, path, layer_label="last layer"):
    """Draws a 3 x h grid of heatmaps (rows: encoder, decoder, cross) into `path` (PNG), at most
    `MAX_FIGURE_INCHES` x `MAX_FIGURE_INCHES` at `DPI`."""
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    heads = weights["encoder"].shape[0]
    rows = [
        ("encoder self-attention", weights["encoder"], weights["source_tokens"], weights["source_tokens"]),
        ("decoder self-attention", weights["decoder"], weights["target_tokens"], weights["target_tokens"]),
        ("encoder-decoder attention", weights["cross"], weights["target_tokens"], weights["source_tokens"]),
    ]
    cell = _cell_inches(heads, max(len(weights["source_tokens"]), len(weights["target_tokens"])))
    height = cell * 3 + 1
    figure, axes = plt.subplots(3, heads, figsize=(cell * heads, height), squeeze=False)
    for r, (title, matrix, y_tokens, x_tokens) in enumerate(rows):
        x_positions, x_labels, x_font = _tick_labels(x_tokens, cell)
        y_positions, y_labels, y_font = _tick_labels(y_tokens, cell)
        for h in range(heads):
            axis = axes[r][h]
            axis.imshow(matrix[h], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            axis.set_xticks(x_positions, x_labels, rotation=90, fontsize=x_font)
            axis.set_yticks(y_positions, y_labels, fontsize=y_font)
            axis.set_title(f"{title}, head {h + 1}", fontsize=8)
    title = f"Attention weights, {layer_label}: " + " ".join(weights["output_tokens"])
    figure.suptitle(_title(title, cell * heads), fontsize=9, y=1 - 0.1 / height, va="top")
    # The top 0.4 inches stay the title's: tight_layout alone let tall figures' heads cover it.
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.4 / height))
    figure.savefig(path, dpi=DPI)
    plt.close(figure)
    return path
