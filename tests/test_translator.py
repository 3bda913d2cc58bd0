"""Translator: strings in, strings out, with defined answers for awkward input."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.data.corpora import read_lines
from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer
from keras_transformer.inference.translator import Translator


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    lines = read_lines("val", "en") + read_lines("val", "de")
    return train_tokenizer(lines, tmp_path_factory.mktemp("spm") / "spm", vocab_size=400)


@pytest.fixture(scope="module")
def translator(tokenizer):
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, max_length=16)
    return Translator(Transformer(config), tokenizer, beam_size=2, max_extra_length=4)


def run(translator, sentences):
    out = translator.translate_strings(tf.constant(sentences, tf.string))
    return [t.decode("utf-8") for t in out["translations"].numpy()], out["scores"].numpy()


def test_batch_in_batch_out_and_python_api_agree(translator):
    sentences = ["A dog runs.", "Two men are playing soccer on a green field.", "Hello"]
    texts, scores = run(translator, sentences)
    assert len(texts) == len(scores) == 3
    assert np.all(scores < 0)
    assert translator.translate(sentences, batch_size=2) == texts
    # The same sentence decodes the same whatever its batch.
    alone, _ = run(translator, [sentences[1]])
    assert alone == [texts[1]]


def test_empty_and_blank_sentences_get_empty_translations(translator):
    texts, scores = run(translator, ["", "   ", "A dog runs."])
    assert texts[:2] == ["", ""]
    assert list(scores[:2]) == [0.0, 0.0]
    assert scores[2] < 0


def test_empty_batch_gives_empty_outputs(translator):
    out = translator.translate_strings(tf.zeros([0], tf.string))
    assert out["translations"].shape == (0,) and out["scores"].shape == (0,)
    assert translator.translate([]) == []


def test_invalid_utf8_is_replaced_not_fatal(translator):
    texts, scores = run(translator, [b"A dog \xff\xfe runs.", b"\xc3"])
    assert len(texts) == 2 and np.all(np.isfinite(scores))
    source = translator.source_ids(tf.constant([b"\xc3"])).numpy()
    assert source.shape[0] == 1 and source[0, -1] == 3  # replacement char, then EOS


def test_long_input_is_truncated_and_output_bounded(translator, tokenizer):
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 40)
    ids = translator.source_ids(tf.constant([long])).numpy()
    assert ids.shape == (1, 16) and ids[0, -1] == 3  # max_length 16, EOS kept
    token_ids, _ = translator.search(ids)
    assert token_ids.shape[1] <= 16 + 4


def test_many_sentences(translator):
    sentences = read_lines("test2016", "en")[:256]
    texts, scores = run(translator, sentences)
    assert len(texts) == 256 and np.all(np.isfinite(scores))


def test_concurrent_batches_give_the_same_translations_in_order(translator):
    sentences = read_lines("test2016", "en")[:40]
    one, one_scores = translator.translate(sentences, batch_size=8, workers=1, return_scores=True)
    three, three_scores = translator.translate(sentences, batch_size=8, workers=3, return_scores=True)
    assert three == one and len(one) == 40
    np.testing.assert_allclose(three_scores, one_scores, rtol=1e-6)
    assert one == [run(translator, [s])[0][0] for s in sentences[:3]] + one[3:]  # each row in its place
    with pytest.raises(ValueError, match="workers"):
        translator.translate(sentences, workers=0)


def test_greedy_translator(tokenizer, translator):
    greedy = Translator(translator.model, tokenizer, beam_size=1, max_extra_length=4)
    texts, scores = run(greedy, ["A dog runs."])
    assert len(texts) == 1 and scores[0] < 0
    assert isinstance(greedy.tokenizer, Tokenizer)
