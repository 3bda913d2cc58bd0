"""CTranslate2 export: the converted model computes what ours computes.

ctranslate2 is part of the `test` extra, so `make test` runs these.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

ctranslate2 = pytest.importorskip("ctranslate2")

from keras_transformer import Transformer, TransformerConfig  # noqa: E402
from keras_transformer.decoding import beam_search, greedy_search  # noqa: E402
from keras_transformer.inference.ctranslate2 import (  # noqa: E402
    default_vocabulary,
    export_ctranslate2,
    transformer_spec,
)

VOCAB = 120
BOS, EOS = 2, 3

CONFIGS = {
    # The paper's model: post-LN, sinusoids, one shared embedding matrix, no attention biases.
    "paper": dict(),
    # Every other supported variant at once.
    "variants": dict(
        norm_first=True,
        positional_encoding="learned",
        max_length=64,
        share_embeddings=False,
        use_bias=True,
        activation="gelu",
    ),
}


def _model(**overrides):
    model = Transformer(TransformerConfig.tiny(VOCAB, **overrides))
    model.build()
    return model


def _sentences(seed, lengths):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(4, VOCAB, size=n)] for n in lengths]


def _padded(sentences):
    width = max(len(s) for s in sentences)
    return np.array([s + [0] * (width - len(s)) for s in sentences], np.int32)


def _strip(ids):
    """Our output row -> tokens as CTranslate2 returns them (no end token, no padding)."""
    ids = [int(i) for i in ids if i != 0]
    return ids[: ids.index(EOS)] if EOS in ids else ids


@pytest.fixture(params=sorted(CONFIGS))
def exported(request, tmp_path):
    model = _model(**CONFIGS[request.param])
    path = export_ctranslate2(model, str(tmp_path / "ct2"), add_source_eos=False)
    translator = ctranslate2.Translator(path, device="cpu", intra_threads=1)
    return model, translator, default_vocabulary(VOCAB)


def test_teacher_forced_log_probs_match(exported):
    model, translator, vocab = exported
    sources = _sentences(0, [5, 9, 7])
    targets = _sentences(1, [4, 6, 3])
    results = translator.score_batch([[vocab[i] for i in s] for s in sources], [[vocab[i] for i in t] for t in targets])
    for source, target, result in zip(sources, targets, results):
        logits = model((np.array([source]), np.array([[BOS] + target])), training=False)
        log_probs = tf.nn.log_softmax(logits[0]).numpy()
        ours = [log_probs[j, token] for j, token in enumerate(target + [EOS])]
        assert result.tokens == [vocab[i] for i in target] + ["</s>"]
        np.testing.assert_allclose(result.log_probs, ours, atol=1e-4)


def test_greedy_outputs_match(exported):
    model, translator, vocab = exported
    sources = _sentences(2, [6, 10, 3, 8])
    # CTranslate2's min_decoding_length defaults to 1 (no empty output); ours to 0.
    ours, _ = greedy_search(model, _padded(sources), max_length=12, min_length=1)
    # Our search never generates the pad id; tell CTranslate2 the same.
    theirs = translator.translate_batch(
        [[vocab[i] for i in s] for s in sources],
        beam_size=1,
        max_decoding_length=12,
        suppress_sequences=[["<pad>"]],
    )
    for row, result in zip(ours.numpy(), theirs):
        assert [vocab[i] for i in _strip(row)] == result.hypotheses[0]


def test_beam_outputs_match_at_fixed_length(exported):
    # With min = max length every hypothesis has the same length, so the two
    # length penalties (GNMT's and CTranslate2's) rank alike.
    model, translator, vocab = exported
    sources = _sentences(3, [7, 4, 9])
    ours, _ = beam_search(model, _padded(sources), beam_size=4, alpha=0.6, max_length=8, min_length=8)
    theirs = translator.translate_batch(
        [[vocab[i] for i in s] for s in sources],
        beam_size=4,
        min_decoding_length=8,
        max_decoding_length=8,
        suppress_sequences=[["<pad>"]],
    )
    for row, result in zip(ours.numpy(), theirs):
        assert len(result.hypotheses[0]) == 8
        assert [vocab[i] for i in _strip(row)] == result.hypotheses[0]


def test_int8_export_and_config(tmp_path):
    """The int8 export is the same model with 8-bit weights: its teacher-forced log-probabilities
    stay within quantization error of ours (and the float32 export's match ours exactly).

    The weights are read back with `compute_type="float32"`: CTranslate2 dequantizes what the export
    stored (int8 values and their scales), so this measures the export alone. Its int8 matmuls are the
    CPU's business: on AVX2 without VNNI (e.g. AMD EPYC Milan), its default oneDNN u8s8 kernel moved
    these log-probabilities by up to 1.0, and by 0.04 with `CT2_USE_MKL=1`.
    """
    model = _model()
    path = export_ctranslate2(model, str(tmp_path / "int8"), quantization="int8")
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    assert config["add_source_eos"] is True  # as keras_transformer.data does
    assert config["decoder_start_token"] == "<s>" and config["eos_token"] == "</s>"
    assert os.path.exists(os.path.join(path, "shared_vocabulary.json")) or os.path.exists(
        os.path.join(path, "source_vocabulary.json")
    )
    vocab = default_vocabulary(VOCAB)
    sources, targets = _sentences(4, [5, 8, 6]), _sentences(5, [4, 7, 3])
    source_tokens = [[vocab[i] for i in s] for s in sources]
    target_tokens = [[vocab[i] for i in t] for t in targets]
    stored = ctranslate2.Translator(path, device="cpu", compute_type="float32", intra_threads=1)
    differences = []
    for source, target, result in zip(sources, targets, stored.score_batch(source_tokens, target_tokens)):
        # add_source_eos=True: CTranslate2 appends the end token to the source, as our data pipeline does.
        logits = model((np.array([source + [EOS]]), np.array([[BOS] + target])), training=False)
        log_probs = tf.nn.log_softmax(logits[0]).numpy()
        ours = np.array([log_probs[j, token] for j, token in enumerate(target + [EOS])])
        assert result.tokens == [vocab[i] for i in target] + ["</s>"]
        differences.append(np.abs(np.array(result.log_probs) - ours))
    differences = np.concatenate(differences)
    # Not the float32 model: int8 rounding moves every log-probability a little, but not far.
    # (Measured: 0.029 at most; a float32 export differs from ours by < 1e-4, test above.)
    assert 1e-3 < differences.max() < 0.05, differences
    # The int8 model also runs with int8 matmuls, CTranslate2's point of it.
    int8 = ctranslate2.Translator(path, device="cpu", compute_type="int8", intra_threads=1)
    for target, result in zip(targets, int8.score_batch(source_tokens, target_tokens)):
        assert result.tokens == [vocab[i] for i in target] + ["</s>"]
        assert np.all(np.isfinite(result.log_probs)) and np.all(np.array(result.log_probs) <= 0)


def test_vocabulary_is_checked():
    model = _model()
    with pytest.raises(ValueError, match="vocab_size"):
        transformer_spec(model, vocabulary=["a", "b"])
    with pytest.raises(ValueError, match="duplicate"):
        transformer_spec(model, vocabulary=["x"] * VOCAB)
    custom = ["<pad>", "<unk>", "<s>", "</s>"] + [f"w{i}" for i in range(4, VOCAB)]
    spec = transformer_spec(model, vocabulary=custom)
    assert spec.config.bos_token == "<s>" and spec.config.unk_token == "<unk>"


def test_unsupported_activation_is_rejected():
    model = _model(activation="softplus")
    with pytest.raises(ValueError, match="activation"):
        transformer_spec(model)


def test_export_refuses_a_directory_it_did_not_write(tmp_path):
    """The converter deletes the directory it replaces: a run directory (checkpoints, config.json)
    or a file is refused and left as it was, whatever `force` says."""
    model = _model()
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "ckpt-100.weights.h5").write_bytes(b"weights")
    (run_dir / "config.json").write_text("{}")
    lone_file = tmp_path / "notes.txt"
    lone_file.write_text("keep me")
    for target in (run_dir, run_dir / "checkpoints", lone_file):
        for force in (True, False):
            with pytest.raises(FileExistsError, match=f"{target}.*(not a directory|neither empty nor)"):
                export_ctranslate2(model, str(target), force=force)
    assert (run_dir / "checkpoints" / "ckpt-100.weights.h5").read_bytes() == b"weights"
    assert (run_dir / "config.json").read_text() == "{}" and lone_file.read_text() == "keep me"
    assert sorted(os.listdir(run_dir)) == ["checkpoints", "config.json"]


def test_export_replaces_an_empty_or_ctranslate2_directory(tmp_path):
    """Re-running an export replaces the model it wrote (the default `force=True`); `force=False` refuses."""
    path = tmp_path / "ct2"
    path.mkdir()  # empty: used
    first = _model()
    export_ctranslate2(first, str(path))
    with pytest.raises(FileExistsError, match="already holds a CTranslate2 model; pass force=True"):
        export_ctranslate2(first, str(path), force=False)
    rng = np.random.default_rng(6)  # a second model, other weights: it replaces the first
    second = _model()
    second.set_weights([rng.normal(size=w.shape).astype(w.dtype) for w in second.get_weights()])
    export_ctranslate2(second, str(path))
    vocab = default_vocabulary(VOCAB)
    source, target = _sentences(7, [5])[0], _sentences(8, [4])[0]
    result = ctranslate2.Translator(str(path), device="cpu", intra_threads=1).score_batch(
        [[vocab[i] for i in source]], [[vocab[i] for i in target]]
    )[0]
    logits = second((np.array([source + [EOS]]), np.array([[BOS] + target])), training=False)
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    np.testing.assert_allclose(result.log_probs, [log_probs[j, t] for j, t in enumerate(target + [EOS])], atol=1e-3)
