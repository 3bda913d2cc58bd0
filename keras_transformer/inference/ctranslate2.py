"""Export a trained `Transformer` to CTranslate2, a C++ inference engine for Transformers.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) runs beam search on CPU in
float32 or with int8 weights, typically several times faster than a Python
framework's decoding loop (see `benchmarks/decode_throughput.py`). This module
builds its model description with CTranslate2's Python spec API
(`ctranslate2.specs.TransformerSpec.from_config`) and fills it with this
package's weights, so no other training framework is involved.

    from keras_transformer.inference.ctranslate2 import export_ctranslate2

    export_ctranslate2(model, "ct2_model", tokenizer=tokenizer)            # float32
    export_ctranslate2(model, "ct2_int8", tokenizer=tokenizer, quantization="int8")

    import ctranslate2
    translator = ctranslate2.Translator("ct2_model", device="cpu", intra_threads=2)
    pieces = tokenizer.pieces(tokenizer.encode("A man is riding a bicycle."))
    result = translator.translate_batch([pieces], beam_size=4)
    print(result[0].hypotheses[0])          # target pieces, without the end token

What maps to what (CTranslate2 stores linear weights as `[out, in]`, Keras as
`[in, out]`, hence the transposes):

| keras_transformer                           | CTranslate2 spec                                   |
|---------------------------------------------|----------------------------------------------------|
| shared (or source / target) embedding       | `encoder.embeddings[0]`, `decoder.embeddings`      |
| x sqrt(d_model) in the embedding (§3.4)     | `scale_embeddings = True`                          |
| output projection (the shared matrix, §3.4) | `decoder.projection.weight`                        |
| positional encoding (sinusoids or learned)  | `*.position_encodings.encodings` (the table) [1]   |
| self-attention W^Q, W^K, W^V; W^O           | `self_attention.linear[0]` (fused QKV), `[1]`      |
| cross-attention W^Q; W^K, W^V; W^O          | `attention.linear[0]`, `[1]` (fused KV), `[2]`     |
| feed-forward inner / outer Dense            | `ffn.linear_0`, `ffn.linear_1`                     |
| each SublayerConnection's LayerNorm         | the sublayer's `layer_norm` (post-LN: `pre_norm=False`) |
| final LayerNorm of each stack (pre-LN only) | `encoder.layer_norm`, `decoder.layer_norm`         |

[1] The table itself is exported because our sinusoids interleave sin and cos
(as the paper writes them) while CTranslate2's built-in ones concatenate them.

Token ids follow `keras_transformer.special_ids`: 0 pad, 1 unk, 2 bos (the
decoder start token), 3 eos. CTranslate2 speaks tokens (strings): pass the
`Tokenizer` (its SentencePiece pieces become the vocabulary and the model file
is copied next to the weights) or a list of `vocab_size` strings; without
either, the vocabulary is `<pad> <unk> <s> </s> 4 5 6 ...` (token = its id).

Our data pipeline appends the end token to every source sentence
(`keras_transformer.data`), so by default CTranslate2 is told to do the same
(`add_source_eos=True`): give it the source pieces without `</s>`.

Supported: post-LN and pre-LN, sinusoidal or learned positions, shared or
separate embeddings, biased or bias-free attention, relu/gelu/swish/tanh/
sigmoid feed-forward activations, d_k = d_v = d_model / h. CTranslate2 itself
is an optional dependency (`pip install ctranslate2`, in `.[bench]`).
"""

from __future__ import annotations

import os

import numpy as np

from keras_transformer.layers.positional_encoding import LearnedPositionalEmbedding, sinusoidal_encoding
from keras_transformer.special_ids import SPECIAL_TOKENS

__all__ = ["export_ctranslate2", "transformer_spec", "default_vocabulary"]

_ACTIVATIONS = {
    "relu": "RELU",
    "gelu": "GELU",
    "swish": "SWISH",
    "silu": "SWISH",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
}


def _require_ctranslate2():
    try:
        import ctranslate2  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            "export_ctranslate2 needs the ctranslate2 package: pip install ctranslate2 (or pip install -e '.[bench]')."
        ) from error
    return ctranslate2


def default_vocabulary(vocab_size):
    """`["<pad>", "<unk>", "<s>", "</s>", "4", "5", ...]`: token i is the string of id i (from 4 on)."""
    return list(SPECIAL_TOKENS[: min(vocab_size, 4)]) + [str(i) for i in range(4, vocab_size)]


def _vocabulary(model, vocabulary, tokenizer):
    vocab_size = model.config.vocab_size
    if tokenizer is not None:
        if vocabulary is not None:
            raise ValueError("Give either `vocabulary` or `tokenizer`, not both.")
        vocabulary = tokenizer.pieces(list(range(tokenizer.vocab_size)))
    if vocabulary is None:
        return default_vocabulary(vocab_size)
    vocabulary = [str(token) for token in vocabulary]
    if len(vocabulary) != vocab_size:
        raise ValueError(f"The vocabulary has {len(vocabulary)} tokens but the model's vocab_size is {vocab_size}.")
    if len(set(vocabulary)) != len(vocabulary):
        raise ValueError("The vocabulary has duplicate tokens; CTranslate2 needs one token per id.")
    return vocabulary


def _numpy(variable):
    # Variables stay float32 under mixed precision policies; cast anyway (e.g. a float64 model).
    return np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable, dtype=np.float32)


def _set_linear(spec, kernel, bias=None):
    spec.weight = np.ascontiguousarray(_numpy(kernel).T)  # Keras [in, out] -> CTranslate2 [out, in]
    if bias is not None:
        spec.bias = _numpy(bias)


def _set_fused_linear(spec, kernels, biases):
    spec.weight = np.ascontiguousarray(np.concatenate([_numpy(k).T for k in kernels], axis=0))
    if all(b is not None for b in biases):
        spec.bias = np.concatenate([_numpy(b) for b in biases], axis=0)


def _set_layer_norm(spec, layer_norm):
    spec.gamma = _numpy(layer_norm.gamma)
    spec.beta = _numpy(layer_norm.beta)


def _set_attention(spec, attention, connection, self_attention):
    a = attention
    if self_attention:
        _set_fused_linear(
            spec.linear[0], [a.query_kernel, a.key_kernel, a.value_kernel], [a.query_bias, a.key_bias, a.value_bias]
        )
    else:
        _set_linear(spec.linear[0], a.query_kernel, a.query_bias)
        _set_fused_linear(spec.linear[1], [a.key_kernel, a.value_kernel], [a.key_bias, a.value_bias])
    _set_linear(spec.linear[-1], a.output_kernel, a.output_bias)
    _set_layer_norm(spec.layer_norm, connection.layer_norm)


def _set_feed_forward(spec, feed_forward, connection):
    _set_linear(spec.linear_0, feed_forward.inner.kernel, feed_forward.inner.bias)
    _set_linear(spec.linear_1, feed_forward.outer.kernel, feed_forward.outer.bias)
    _set_layer_norm(spec.layer_norm, connection.layer_norm)


def _position_table(positions_layer, d_model, max_positions):
    if isinstance(positions_layer, LearnedPositionalEmbedding):
        return _numpy(positions_layer.position_embeddings)
    return np.asarray(sinusoidal_encoding(np.arange(max_positions), d_model, "float32"), dtype=np.float32)


def _check_supported(model):
    c = model.config
    activation = c.activation if isinstance(c.activation, str) else getattr(c.activation, "__name__", "")
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"CTranslate2 export: activation {c.activation!r} is not supported "
            f"(supported: {', '.join(sorted(_ACTIVATIONS))})."
        )
    if c.key_dim * c.num_heads != c.d_model or c.value_dim != c.key_dim:
        raise ValueError(
            "CTranslate2 export needs key_dim = value_dim = d_model / num_heads; got "
            f"d_model={c.d_model}, num_heads={c.num_heads}, key_dim={c.key_dim}, value_dim={c.value_dim}."
        )
    return activation


def transformer_spec(model, vocabulary=None, tokenizer=None, max_positions=1024, add_source_eos=True):
    """The CTranslate2 `TransformerSpec` of `model`, weights set (not yet validated or quantized).

    Args:
        model: a built `keras_transformer.Transformer` (call it once, or
            `model.build()`, before exporting).
        vocabulary: list of `vocab_size` token strings, token i for id i.
        tokenizer: a `keras_transformer.data.tokenizer.Tokenizer`; its pieces are
            the vocabulary (alternative to `vocabulary`).
        max_positions: rows of the sinusoidal position table CTranslate2
            gets: the longest source, and the longest output + 1, it can
            handle. Ignored for learned positions (their table is exported).
        add_source_eos: CTranslate2 appends the end token to every source,
            as `keras_transformer.data` does for training.

    Returns:
        a `ctranslate2.specs.TransformerSpec`.
    """
    ctranslate2 = _require_ctranslate2()
    from ctranslate2.specs import common_spec

    if not model.built:
        model.build()
    activation = _check_supported(model)
    c = model.config
    tokens = _vocabulary(model, vocabulary, tokenizer)

    spec = ctranslate2.specs.TransformerSpec.from_config(
        (c.num_layers, c.num_layers),
        c.num_heads,
        pre_norm=c.norm_first,
        activation=getattr(common_spec.Activation, _ACTIVATIONS[activation]),
    )
    spec.config.layer_norm_epsilon = float(c.layer_norm_epsilon)
    spec.config.unk_token, spec.config.bos_token, spec.config.eos_token = tokens[1], tokens[2], tokens[3]
    spec.config.decoder_start_token = tokens[2]
    spec.config.add_source_bos = False
    spec.config.add_source_eos = bool(add_source_eos)

    # Embeddings (§3.4): both scaled by sqrt(d_model), as CTranslate2's scale_embeddings does.
    source_embeddings = _numpy(model.source_embedding.embeddings)
    target_embeddings = (
        source_embeddings
        if model.target_embedding is model.source_embedding
        else _numpy(model.target_embedding.embeddings)
    )
    projection = (
        target_embeddings
        if model.output_projection is model.target_embedding
        else _numpy(model.output_projection.embeddings)
    )
    if not (model.source_embedding.scale and model.target_embedding.scale):
        raise ValueError("CTranslate2 export: the source and target embeddings must both be scaled by sqrt(d_model).")
    spec.encoder.embeddings[0].weight = source_embeddings
    spec.encoder.scale_embeddings = True
    spec.decoder.embeddings.weight = target_embeddings
    spec.decoder.scale_embeddings = True
    spec.decoder.projection.weight = projection  # [V, d_model]: already CTranslate2's [out, in]

    # Positions (§3.5). CTranslate2 adds row t to the embedding of position t.
    spec.encoder.position_encodings.encodings = _position_table(model.source_positions, c.d_model, max_positions)
    spec.decoder.position_encodings.encodings = _position_table(model.target_positions, c.d_model, max_positions)

    for layer_spec, layer in zip(spec.encoder.layer, model.encoder.encoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_connection, True)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_connection)
    for layer_spec, layer in zip(spec.decoder.layer, model.decoder.decoder_layers):
        _set_attention(layer_spec.self_attention, layer.self_attention, layer.self_attention_connection, True)
        _set_attention(layer_spec.attention, layer.cross_attention, layer.cross_attention_connection, False)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.feed_forward_connection)
    if c.norm_first:
        _set_layer_norm(spec.encoder.layer_norm, model.encoder.final_norm)
        _set_layer_norm(spec.decoder.layer_norm, model.decoder.final_norm)

    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


# What a CTranslate2 model directory holds: model.bin and config.json, and the files beside them.
_MODEL_FILES = {"model.bin", "config.json"}
_OTHER_MODEL_FILES = {
    "shared_vocabulary.json",
    "source_vocabulary.json",
    "target_vocabulary.json",
    "shared_vocabulary.txt",
    "source_vocabulary.txt",
    "target_vocabulary.txt",
    "vocabulary.json",
    "vocabulary.txt",
    "vmap.txt",
    "sentencepiece.model",
}


def _check_replaceable(output_dir, force):
    """Raises FileExistsError unless `output_dir` is absent, empty, or (with `force`) a CTranslate2 model."""
    if not os.path.lexists(output_dir):
        return
    if os.path.islink(output_dir) or not os.path.isdir(output_dir):
        raise FileExistsError(
            f"export_ctranslate2: {output_dir} exists and is not a directory (a file or a "
            "symbolic link); give a new or empty directory."
        )
    entries = sorted(os.listdir(output_dir))
    if not entries:
        return
    foreign = [
        e
        for e in entries
        if e not in _MODEL_FILES | _OTHER_MODEL_FILES or not os.path.isfile(os.path.join(output_dir, e))
    ]
    if foreign or not _MODEL_FILES <= set(entries):
        shown = foreign or entries
        listed = ", ".join(shown[:3]) + (", ..." if len(shown) > 3 else "")
        raise FileExistsError(
            f"export_ctranslate2: {output_dir} is neither empty nor a CTranslate2 model "
            f"directory (it holds {listed}); refusing to replace it. Give a new or empty "
            "directory."
        )
    if not force:
        raise FileExistsError(
            f"export_ctranslate2: {output_dir} already holds a CTranslate2 model; pass force=True to replace it."
        )


def export_ctranslate2(
    model,
    output_dir,
    quantization=None,
    vocabulary=None,
    tokenizer=None,
    max_positions=1024,
    add_source_eos=True,
    force=True,
):
    """Writes `model` as a CTranslate2 model directory (`model.bin`, `config.json`, vocabularies).

    Args:
        model: a built `keras_transformer.Transformer` (any dtype policy: the
            float32 variables are exported).
        output_dir: directory to create. If it exists it must be empty or
            a CTranslate2 model directory (see `force`); anything else in it
            is refused, so an export never deletes a run's checkpoints.
        quantization: None (float32) or a CTranslate2 weight type: "int8",
            "int8_float32", "int8_float16", "int8_bfloat16", "int16",
            "float16", "bfloat16", "float32". The compute type can still be
            chosen when loading (`ctranslate2.Translator(..., compute_type=...)`).
        vocabulary, tokenizer, max_positions, add_source_eos: see
            `transformer_spec`. With a tokenizer, its SentencePiece model is
            also written to `output_dir/sentencepiece.model`.
        force: replace an existing CTranslate2 model directory (True by
            default, so re-running an export updates it).

    Returns:
        `output_dir`.

    Raises:
        ImportError: ctranslate2 is not installed.
        ValueError: the model uses something CTranslate2 cannot express, or
            the vocabulary does not fit.
        FileExistsError: `output_dir` exists and is neither empty nor a
            CTranslate2 model directory, or is one and `force` is False.
    """
    ctranslate2 = _require_ctranslate2()
    output_dir = os.fspath(output_dir)
    _check_replaceable(output_dir, force)  # before any work: the converter deletes what it replaces
    spec = transformer_spec(
        model,
        vocabulary=vocabulary,
        tokenizer=tokenizer,
        max_positions=max_positions,
        add_source_eos=add_source_eos,
    )

    class _SpecConverter(ctranslate2.converters.Converter):
        """CTranslate2's own convert(): validate, optimize (alias shared weights, quantize), save."""

        def _load(self):
            return spec

    _SpecConverter().convert(output_dir, quantization=quantization, force=True)
    if tokenizer is not None:
        tokenizer.save(os.path.join(output_dir, "sentencepiece.model"))
    return output_dir
