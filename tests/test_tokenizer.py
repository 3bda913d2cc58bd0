"""Tests for keras_transformer.data.tokenizer (SentencePiece BPE, in-graph)."""

import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from keras_transformer.data import corpora
from keras_transformer.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    train_tokenizer,
    vocabulary_difference,
)

VOCAB_SIZE = 1000


def _train_texts():
    return corpora.read_lines("train", "en")[:2500] + corpora.read_lines("train", "de")[:2500]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(_train_texts(), tmp_path_factory.mktemp("spm") / "spm", vocab_size=VOCAB_SIZE)


@pytest.fixture(scope="module")
def val_sentences():
    # Not in the training subset.
    return corpora.read_lines("val", "en")[:200] + corpora.read_lines("val", "de")[:200]


def _decode(strings):
    return [s.decode("utf-8") for s in strings.numpy()]


def test_special_ids_and_vocab(tokenizer):
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert tokenizer.vocab_size == VOCAB_SIZE
    assert tokenizer.pieces([PAD_ID, UNK_ID, BOS_ID, EOS_ID]) == ["<pad>", "<unk>", "<s>", "</s>"]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id) == (PAD_ID, BOS_ID, EOS_ID)


def test_round_trip_on_real_sentences(tokenizer, val_sentences):
    ids = tokenizer.tokenize(val_sentences)
    assert isinstance(ids, tf.RaggedTensor) and ids.dtype == tf.int32
    assert ids.shape[0] == len(val_sentences)
    assert _decode(tokenizer.detokenize(ids)) == val_sentences
    flat = ids.flat_values.numpy()
    # Ids are in [1, vocab): padding (0) is never produced, nor BOS/EOS.
    assert flat.min() >= 1 and flat.max() < VOCAB_SIZE
    assert not np.isin(flat, [PAD_ID, BOS_ID, EOS_ID]).any()
    # Subwords, not characters: far fewer ids than characters.
    assert len(flat) < 0.5 * sum(len(s) for s in val_sentences)


def test_unseen_characters_round_trip_via_byte_fallback(tokenizer):
    news = corpora.read_newstest2014("de")
    assert "\u00ad" in news[900]  # soft hyphen, kept exactly (identity normalization)
    text = ["Ein Café in Zürich: 日本 – ok", "Größe ÆØÅ", news[900], news[1831]]
    ids = tokenizer.tokenize(text)
    assert UNK_ID not in ids.flat_values.numpy()
    assert _decode(tokenizer.detokenize(ids)) == text


def test_detokenize_drops_special_and_everything_after_eos(tokenizer):
    a, b = tokenizer.encode("A dog runs."), tokenizer.encode("Zwei Männer.")
    width = max(len(a), len(b)) + 4
    dense = np.zeros([2, width], np.int32)
    dense[0, : len(a) + 4] = [BOS_ID] + a + [EOS_ID] + b[:2]  # junk after EOS
    dense[1, : len(b) + 1] = [BOS_ID] + b  # no EOS, just padding
    assert _decode(tokenizer.detokenize(dense)) == ["A dog runs.", "Zwei Männer."]
    assert _decode(tokenizer.detokenize(tf.constant(dense, tf.int64))) == ["A dog runs.", "Zwei Männer."]
    ragged = tf.ragged.constant([a + [EOS_ID], [BOS_ID] + b])
    assert _decode(tokenizer.detokenize(ragged)) == ["A dog runs.", "Zwei Männer."]
    single = tokenizer.detokenize(dense[0])
    assert single.shape == () and single.numpy().decode() == "A dog runs."
    assert tokenizer.detokenize(tf.constant([[EOS_ID, *a]])).numpy().tolist() == [b""]


def test_works_inside_tf_function_and_tf_data(tokenizer, val_sentences):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(strings):
        ids = tokenizer.tokenize(strings)
        padded = ids.to_tensor()  # dense padded ids, as a model would output
        return tokenizer.detokenize(padded), tokenizer.id_to_piece(ids)

    text, pieces = round_trip(tf.constant(val_sentences[:5]))
    assert _decode(text) == val_sentences[:5]
    assert pieces.to_list()[0] == [p.encode() for p in tokenizer.pieces(tokenizer.encode(val_sentences[0]))]

    ds = tf.data.Dataset.from_tensor_slices(val_sentences[:8]).batch(4).map(tokenizer.tokenize)
    rows = [r for batch in ds for r in batch.to_list()]
    assert rows == [tokenizer.encode(s) for s in val_sentences[:8]]


def test_saved_model_keeps_the_sentencepiece_model(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.detok = tf.function(
        lambda ids: tokenizer.detokenize(ids), input_signature=[tf.TensorSpec([None, None], tf.int32)]
    )
    tf.saved_model.save(module, str(tmp_path / "sm"))
    loaded = tf.saved_model.load(str(tmp_path / "sm"))
    ids = tokenizer.tokenize(["A little girl climbing."]).to_tensor()
    assert _decode(loaded.detok(ids)) == ["A little girl climbing."]


def test_save_load_bytes_and_pieces(tokenizer, tmp_path):
    path = tokenizer.save(tmp_path / "copy.model")
    from_file, from_bytes = Tokenizer(path), Tokenizer(tokenizer.model_proto)
    assert from_file.model_proto == from_bytes.model_proto == tokenizer.model_proto
    ids = tokenizer.encode("A man in an orange hat.")
    assert from_bytes.encode("A man in an orange hat.") == ids
    pieces = tokenizer.pieces(ids)
    assert all(isinstance(p, str) for p in pieces) and len(pieces) == len(ids)
    assert "".join(pieces).replace("\u2581", " ").strip() == "A man in an orange hat."
    assert tokenizer.pieces(np.array([[ids[0], PAD_ID]])) == [[pieces[0], "<pad>"]]


def test_training_is_deterministic(tokenizer, tmp_path):
    again = train_tokenizer(_train_texts(), tmp_path / "again", vocab_size=VOCAB_SIZE)
    every_id = list(range(VOCAB_SIZE))
    assert again.pieces(every_id) == tokenizer.pieces(every_id)
    sentence = "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."
    assert again.encode(sentence) == tokenizer.encode(sentence)


def test_full_multi30k_vocab_trains(tmp_path):
    """The demo's vocabulary: 8,000 joint pieces over all 58,000 Multi30k training sentences."""
    texts = corpora.read_lines("train", "en") + corpora.read_lines("train", "de")
    tok = train_tokenizer(texts, tmp_path / "full", vocab_size=8000)
    assert tok.vocab_size == 8000
    # Every sentence round-trips (byte fallback: no piece is lost).
    sample = texts[::997]
    assert [s.decode("utf-8") for s in tok.detokenize(tok.tokenize(sample)).numpy()] == sample


def test_rejects_model_with_other_special_ids(tmp_path):
    prefix = str(tmp_path / "default_ids")
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_train_texts()[:500]), model_prefix=prefix, vocab_size=200, minloglevel=2
    )  # unk=0, bos=1, eos=2, no pad
    with pytest.raises(ValueError, match="special ids"):
        Tokenizer(prefix + ".model")


def test_survives_tf_random_set_seed(tokenizer):
    # tf.random.set_seed clears the eager kernel cache, which used to delete
    # tensorflow_text's kernel-owned SentencePiece resource (tensorflow/text#570).
    tokenizer.tokenize(["A dog."])
    tf.random.set_seed(0)
    fresh = Tokenizer(tokenizer.model_proto)  # same model: shares the resource
    tf.random.set_seed(1)
    assert tokenizer.tokenize(["A dog."]).to_list() == fresh.tokenize(["A dog."]).to_list()
    assert _decode(tokenizer.detokenize(tokenizer.tokenize(["A dog."]))) == ["A dog."]


def test_sampling_alpha_samples_segmentations_of_the_same_text(tokenizer, val_sentences):
    sentences = val_sentences[:100]
    best = tokenizer.tokenize(sentences).to_list()
    assert tokenizer.tokenize(sentences, sampling_alpha=0.0).to_list() == best
    draws = [tokenizer.tokenize(sentences, sampling_alpha=0.1) for _ in range(3)]
    for ids in draws:
        # Another segmentation of the same text: it detokenizes to the sentence.
        assert _decode(tokenizer.detokenize(ids)) == sentences
        flat = ids.flat_values.numpy()
        assert flat.min() >= 1 and flat.max() < VOCAB_SIZE
        assert not np.isin(flat, [PAD_ID, BOS_ID, EOS_ID]).any()
    lists = [ids.to_list() for ids in draws]
    assert lists[0] != best and lists[0] != lists[1]  # new samples at every call
    # BPE-dropout skips merges: sampled segmentations are longer, never shorter in total.
    assert sum(map(len, lists[0])) > sum(map(len, best))
    # A larger alpha drops more merges.
    coarse = sum(len(row) for row in tokenizer.tokenize(sentences, sampling_alpha=0.5).to_list())
    assert coarse > sum(map(len, lists[0]))


def test_a_sampling_tokenizer_still_saves_as_before(tokenizer, tmp_path):
    tokenizer.tokenize(["A dog."], sampling_alpha=0.3)  # creates a sampler
    module = tf.Module()
    module.tokenizer = tokenizer
    module.encode = tf.function(
        lambda s: tokenizer.tokenize(s).to_tensor(), input_signature=[tf.TensorSpec([None], tf.string)]
    )
    tf.saved_model.save(module, str(tmp_path / "saved"))
    loaded = tf.saved_model.load(str(tmp_path / "saved"))
    expected = tokenizer.tokenize(["A dog runs."]).to_tensor().numpy()
    np.testing.assert_array_equal(loaded.encode(tf.constant(["A dog runs."])).numpy(), expected)


def test_sampling_alpha_works_in_tf_data_and_rejects_bad_values(tokenizer, val_sentences):
    dataset = (
        tf.data.Dataset.from_tensor_slices(val_sentences[:64])
        .batch(32)
        .map(lambda s: tokenizer.tokenize(s, sampling_alpha=0.2).to_tensor())
    )
    rows = [tuple(r[r > 0]) for batch in dataset for r in batch.numpy()]
    again = [tuple(r[r > 0]) for batch in dataset for r in batch.numpy()]
    assert rows != again  # every pass samples anew
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match=rf"^sampling_alpha must be in \[0, 1\], got {bad}\.$"):
            tokenizer.tokenize(["A dog."], sampling_alpha=bad)
    for bound in (0.0, 1.0):  # the message's closed interval: 0 is the best segmentation
        assert _decode(tokenizer.detokenize(tokenizer.tokenize(["A dog."], sampling_alpha=bound))) == ["A dog."]


def test_training_on_blank_text_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="every training sentence is empty or blank"):
        train_tokenizer(["", "   ", "\t"], str(tmp_path / "spm"), vocab_size=50)


def test_the_same_vocabulary_trained_twice_is_the_same_though_its_bytes_differ(tokenizer, tmp_path):
    """The model file records the model_prefix it was trained under (get_or_train_tokenizer: a temporary one)."""
    again = train_tokenizer(_train_texts(), tmp_path / "elsewhere" / "spm", vocab_size=VOCAB_SIZE)
    assert again.model_proto != tokenizer.model_proto
    assert vocabulary_difference(again.model_proto, tokenizer.model_proto) is None
    assert vocabulary_difference(tokenizer.save(tmp_path / "copy.model"), again.model_proto) is None
    other = train_tokenizer(_train_texts()[1000:], tmp_path / "other", vocab_size=VOCAB_SIZE)
    assert vocabulary_difference(tokenizer.model_proto, other.model_proto).startswith("piece ")
    smaller = train_tokenizer(_train_texts(), tmp_path / "smaller", vocab_size=VOCAB_SIZE - 100)
    assert vocabulary_difference(tokenizer.model_proto, smaller.model_proto) == "1000 pieces against 900"
    (tmp_path / "broken.model").write_bytes(tokenizer.model_proto + b"\0")
    with pytest.raises(ValueError, match=r"broken.model is not a SentencePiece model"):
        vocabulary_difference(tokenizer.model_proto, tmp_path / "broken.model")


def test_trainer_flags_replace_the_defaults_but_not_the_special_ids(tmp_path):
    from sentencepiece import sentencepiece_model_pb2

    texts = _train_texts()[:600]
    sampled = train_tokenizer(
        texts, tmp_path / "sampled", vocab_size=400, input_sentence_size=300, shuffle_input_sentence=True, minloglevel=2
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(sampled.model_proto)
    assert proto.trainer_spec.input_sentence_size == 300 and proto.trainer_spec.shuffle_input_sentence
    for flags in ({"pad_id": 5}, {"eos_piece": "<end>"}, {"bos_id": -1, "unk_piece": "?"}):
        names = ", ".join(sorted(flags))
        with pytest.raises(
            ValueError,
            match=rf"^train_tokenizer \(tokenizer .*special\): {names} cannot be set: "
            r"keras_transformer.special_ids fixes the special tokens",
        ):
            train_tokenizer(texts, tmp_path / "special", vocab_size=400, **flags)
    with pytest.raises(ValueError, match=r"input cannot be set: the sentences are `texts`"):
        train_tokenizer(texts, tmp_path / "special", vocab_size=400, input="corpus.txt")
    assert not (tmp_path / "special.model").exists()
