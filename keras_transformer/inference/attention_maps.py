"""Attention maps, as in the paper's Figures 3-5 (Vaswani et al., 2017, appendix).

`keras-transformer attention --model RUN_DIR "a sentence"` (or
`attention_weights` and `plot_attention`) translates the
sentence, reruns the model on the source and its translation with
`return_attention_scores`, and draws one layer's heads of the encoder
self-attention, the decoder self-attention and the encoder-decoder
attention, with the subword tokens on the axes.
"""

import numpy as np
import tensorflow as tf

from keras_transformer.special_ids import BOS_ID, PAD_ID


def attention_weights(translator, sentence, layer=-1):
    """Weights of one layer for `sentence` and its translation.

    Returns a dict with `source_tokens`, `target_tokens` (decoder inputs:
    start token, then the translation), and `[heads, rows, cols]` arrays
    `encoder`, `decoder`, `cross`.
    """
    model, tokenizer = translator.model, translator.tokenizer
    source_ids = translator.source_ids(tf.constant([sentence]))
    output_ids, _ = translator.search(source_ids)
    output_ids = output_ids.numpy()[0]
    output_ids = output_ids[output_ids != PAD_ID]
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
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

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
