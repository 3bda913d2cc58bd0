"""Translator: strings in, strings out, with defined answers for awkward input."""

import types

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig, decoding
from keras_transformer.data.corpora import read_lines
from keras_transformer.data.tokenizer import Tokenizer, train_tokenizer
from keras_transformer.inference.translator import Translator
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID


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


def test_a_sentence_is_cut_to_max_input_bytes_before_it_is_read(translator):
    """The bound (64 bytes per token by default) applies before normalization: spaces that normalization would
    collapse still count, so a sentence whose words come after the bound is translated without them."""
    max_bytes = translator.max_input_bytes
    assert max_bytes == 64 * translator.max_input_length == 1024
    padded = "A dog." + " " * max_bytes + "Two men are playing soccer on a green field."
    texts, scores = run(translator, [padded, "A dog."])
    assert texts[0] == texts[1] and scores[0] == pytest.approx(scores[1])
    unbounded = Translator(
        translator.model, translator.tokenizer, beam_size=2, max_extra_length=4, max_input_bytes=10 * max_bytes
    )
    assert run(unbounded, [padded])[1][0] != pytest.approx(scores[1])  # the words after the spaces, read
    # A character cut in two by the bound is dropped, not replaced by U+FFFD; a shorter sentence is untouched.
    cut = "a" * (max_bytes - 1) + "ä" + "b" * 10
    bounded = translator.bounded(tf.constant([cut, "\u00e4 ok", "x" * max_bytes], tf.string)).numpy()
    assert [b.decode("utf-8") for b in bounded] == ["a" * (max_bytes - 1), "\u00e4 ok", "x" * max_bytes]
    assert translator.bounded(tf.constant([b"\xff ok"])).numpy()[0] == b"\xff ok"  # repaired later, as before
    with pytest.raises(ValueError, match="max_input_bytes must be a positive integer"):
        Translator(translator.model, translator.tokenizer, max_input_bytes=-1)


def test_invalid_utf8_is_replaced_not_fatal(translator):
    """Each invalid byte becomes U+FFFD: the answer is that of the repaired sentence."""
    texts, scores = run(translator, [b"A dog \xff\xfe runs.", b"\xc3"])
    repaired, repaired_scores = run(translator, ["A dog \ufffd\ufffd runs.", "\ufffd"])
    assert texts == repaired
    np.testing.assert_allclose(scores, repaired_scores, rtol=1e-6)
    source = translator.source_ids(tf.constant([b"\xc3"])).numpy()
    assert source.shape[0] == 1 and source[0, -1] == 3  # replacement char, then EOS


def test_sentences_are_normalized_as_training_files_are_read(translator):
    """Tabs, runs of spaces, Unicode whitespace at the ends and a byte-order mark: the file reader's answer."""
    from keras_transformer.data.text import decode_text_lines

    raw = ["\ufeffA dog\truns  on the\u00a0beach.\u3000", "\u00a0\u3000", "A man\t \tsleeps."]
    texts, scores = run(translator, raw)
    expected, expected_scores = run(translator, decode_text_lines("\n".join(raw).encode("utf-8"), "test"))
    assert texts == expected and texts[1] == ""  # whitespace only: blank
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-6)
    assert translator.normalized(tf.constant(raw)).numpy().tolist() == [
        "A dog runs on the\u00a0beach.".encode(),
        b"",
        b"A man sleeps.",
    ]


def test_long_input_is_truncated_and_output_bounded(translator, tokenizer):
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 40)
    ids = translator.source_ids(tf.constant([long])).numpy()
    assert ids.shape == (1, 16) and ids[0, -1] == 3  # max_length 16, EOS kept
    assert list(ids[0, :15]) == tokenizer.encode(long)[:15]  # the first 15 pieces of the sentence
    token_ids, _ = translator.search(ids)
    assert token_ids.shape[1] <= 16 + 4


def test_max_input_length_is_capped_by_learned_positions(tokenizer):
    """Learned positions end at the table: a longer max_input_length is refused, not a crash in the graph."""
    config = TransformerConfig.tiny(
        vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, max_length=16, positional_encoding="learned"
    )
    model = Transformer(config)
    with pytest.raises(ValueError, match="max_input_length 17 exceeds the model's max_length 16"):
        Translator(model, tokenizer, beam_size=2, max_input_length=17)
    long = " ".join(["A man in a blue shirt is standing on a ladder."] * 4)
    for max_input_length in (None, 16):  # the default is the table's size
        translator = Translator(model, tokenizer, beam_size=2, max_extra_length=4, max_input_length=max_input_length)
        assert translator.max_input_length == 16
        assert len(translator.translate([long])) == 1


def test_many_sentences(translator):
    sentences = read_lines("test2016", "en")[:256]
    texts, scores = run(translator, sentences)
    assert len(texts) == 256 and np.all(np.isfinite(scores))
    for i in (0, 97, 255):  # a row of a 256-sentence batch is that sentence's translation alone
        alone_text, alone_score = run(translator, [sentences[i]])
        assert texts[i] == alone_text[0] and scores[i] == pytest.approx(alone_score[0], abs=1e-4)


def test_concurrent_batches_give_the_same_translations_in_order(translator):
    sentences = read_lines("test2016", "en")[:40]
    one, one_scores = translator.translate(sentences, batch_size=8, workers=1, return_scores=True)
    three, three_scores = translator.translate(sentences, batch_size=8, workers=3, return_scores=True)
    assert three == one and len(one) == 40
    np.testing.assert_allclose(three_scores, one_scores, rtol=1e-6)
    assert one == [run(translator, [s])[0][0] for s in sentences[:3]] + one[3:]  # each row in its place
    with pytest.raises(ValueError, match="workers"):
        translator.translate(sentences, workers=0)


def test_batches_are_even_and_keep_every_worker_busy():
    from keras_transformer.inference.batching import even_batches

    def sizes(count, batch_size, workers):
        batches = even_batches(np.arange(count), batch_size, workers)
        assert np.array_equal(np.sort(np.concatenate(batches)) if batches else np.arange(0), np.arange(count))
        return [len(batch) for batch in batches]

    assert sizes(600, 512, 2) == [300, 300]  # not 512 and 88
    assert sizes(1000, 256, 2) == [250] * 4
    assert sizes(1000, 256, 3) == [167, 167, 167, 167, 166, 166]
    assert sizes(100, 512, 2) == [100]  # one batch: no split
    assert sizes(3, 2, 4) == [1, 1, 1]  # never an empty batch
    assert sizes(0, 64, 2) == []


def test_each_round_of_batches_is_dealt_the_same_lengths():
    from keras_transformer.inference.batching import even_batches

    order = np.arange(100, 110)  # sentence indices, longest first
    # Two workers, one round: the sentences are dealt in turn, so both get long and short ones.
    assert [list(b) for b in even_batches(order, 5, 2)] == [[100, 102, 104, 106, 108], [101, 103, 105, 107, 109]]
    # Two rounds: the longest six first, each round dealt to the two batches of its round.
    assert [list(b) for b in even_batches(order, 3, 2)] == [[100, 102, 104], [101, 103, 105], [106, 108], [107, 109]]
    assert [list(b) for b in even_batches(order, 4, 1)] == [[100, 101, 102, 103], [104, 105, 106], [107, 108, 109]]


def test_first_calls_of_concurrent_workers_trace_once(tokenizer):
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64, max_length=16)
    fresh = Translator(Transformer(config), tokenizer, beam_size=2, max_extra_length=4)
    sentences = read_lines("test2016", "en")[:12]
    texts = fresh.translate(sentences, batch_size=3, workers=4)  # four untraced calls at once
    assert fresh.translate_strings.experimental_get_tracing_count() == 1
    assert texts == fresh.translate(sentences, batch_size=12, workers=1)


def test_greedy_translator(tokenizer, translator):
    from keras_transformer.decoding import greedy_search

    greedy = Translator(translator.model, tokenizer, beam_size=1, max_extra_length=4)
    texts, scores = run(greedy, ["A dog runs."])
    token_ids, _ = greedy_search(translator.model, greedy.source_ids(tf.constant(["A dog runs."])), max_extra_length=4)
    assert texts == [tokenizer.detokenize(token_ids).numpy()[0].decode("utf-8")] and scores[0] < 0
    assert isinstance(greedy.tokenizer, Tokenizer)


# Scores: log P(Y | X) / ((5 + |Y|) / 6) ** alpha for every beam size, greedy included.


@pytest.mark.parametrize("alpha", [0.6, 0.0])
def test_greedy_scores_are_length_penalized(translator, tokenizer, alpha):
    """Beam 1 scores as beam search does: greedy's log P divided by lp(|Y|), |Y| its non-pad tokens."""
    greedy = Translator(translator.model, tokenizer, beam_size=1, alpha=alpha, max_extra_length=4)
    sentences = ["A dog runs.", "Two men are playing soccer on a green field.", "Hello"]
    _, scores = run(greedy, sentences)
    token_ids, log_p = decoding.greedy_search(
        translator.model, greedy.source_ids(tf.constant(sentences)), max_extra_length=4
    )
    lengths = np.sum(token_ids.numpy() != PAD_ID, axis=-1)
    assert len(set(lengths.tolist())) > 1  # penalties that differ between the sentences
    np.testing.assert_allclose(
        scores, log_p.numpy() / decoding.length_penalty(lengths, alpha).numpy(), rtol=1e-5, atol=1e-6
    )
    if alpha == 0.0:
        np.testing.assert_allclose(scores, log_p.numpy(), rtol=1e-6, atol=1e-6)
    else:
        assert np.all(np.abs(scores - log_p.numpy()) > 1e-3)  # lp(|Y|) > 1: the penalty shows


class ScriptedTranslationModel:
    """A stand-in for `Transformer` whose probabilities we know, so scores can be checked exactly.

    The logits of step i are `table[source length, i] + after[previous token]` (random), with
    the end token favoured where the output would be as long as the source: the outputs end
    with EOS at different lengths, and the K hypotheses of a beam differ.
    """

    def __init__(self, vocab_size, max_length=32, seed=0):
        rng = np.random.default_rng(seed)
        table = rng.normal(0.0, 1.5, size=(max_length + 1, 2 * max_length, vocab_size))
        after = rng.normal(0.0, 1.5, size=(vocab_size, vocab_size))
        for source_length in range(1, max_length + 1):
            table[source_length, source_length - 1, EOS_ID] += 6.0
        table[..., :EOS_ID] = -1e9  # never pad, unk or start
        self.table, self.after = table.astype("float32"), after.astype("float32")
        self.config = types.SimpleNamespace(max_length=max_length, positional_encoding="sinusoidal")

    def logits(self, source_length, step, previous):
        return self.table[source_length, step] + self.after[previous]

    def log_prob(self, source_length, tokens):
        """log P of `tokens` (ending with EOS or not), from the table."""
        total = 0.0
        for step, (previous, token) in enumerate(zip([BOS_ID] + tokens[:-1], tokens)):
            logits = self.logits(source_length, step, previous).astype("float64")
            total += logits[token] - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        return total

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [2]], 0))

    def init_cache(self, memory, max_length):
        batch = tf.shape(memory)[0]
        return {"self": [(tf.zeros([batch, 1, max_length, 2]),) * 2], "cross": [(memory, memory)]}

    def decode_step(self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None):
        if positions is None:
            positions = cache_index + tf.range(tf.shape(target_ids)[1])
        lengths = tf.reduce_sum(tf.cast(tf.not_equal(source_ids, PAD_ID), tf.int32), axis=1)  # [B]
        steps = positions[None, :] + tf.zeros_like(target_ids)  # [B, K]
        index = tf.stack([lengths[:, None] + tf.zeros_like(target_ids), steps], -1)
        return tf.gather_nd(self.table, index) + tf.gather(self.after, target_ids), cache


@pytest.mark.parametrize("beam_size", [1, 2, 3])
def test_score_is_log_p_over_length_penalty_for_every_beam_size(tokenizer, beam_size):
    """score = log P(Y|X) / ((5 + |Y|) / 6) ** alpha, |Y| the generated tokens with EOS."""
    alpha = 0.6
    model = ScriptedTranslationModel(tokenizer.vocab_size)
    translator = Translator(model, tokenizer, beam_size=beam_size, alpha=alpha, max_extra_length=4)
    sentences = ["A dog runs.", "Two men are playing soccer on a green field.", "Hello", "A girl jumps."]
    _, scores = run(translator, sentences)
    source_ids = translator.source_ids(tf.constant(sentences)).numpy()
    token_ids, _ = translator.search(source_ids)
    ended = 0
    for row, (source, ids) in enumerate(zip(source_ids, token_ids.numpy())):
        tokens = [int(t) for t in ids if t != PAD_ID]
        ended += tokens[-1] == EOS_ID
        source_length = int(np.sum(source != PAD_ID))
        expected = model.log_prob(source_length, tokens) / ((5 + len(tokens)) / 6) ** alpha
        np.testing.assert_allclose(scores[row], expected, rtol=1e-5, err_msg=f"sentence {row}: {tokens}")
    assert ended >= 2  # |Y| counts the end token: outputs that have one are checked


def test_translator_searches_with_its_early_stopping_rule(tokenizer):
    """early_stopping reaches the search: "k_finished" and "exact" each give what `beam_search` gives with
    that rule, and on these sentences the two rules disagree (k_finished ends a sentence while an alive
    hypothesis could still win; a strong length penalty makes that common). The export records the
    rule and builds its graph from a Translator with it (test_export.py)."""
    from keras_transformer.decoding import beam_search

    model = ScriptedTranslationModel(tokenizer.vocab_size, seed=0)
    sentences = read_lines("val", "en")[:40]
    outputs = {}
    for rule in ("exact", "k_finished"):
        translator = Translator(model, tokenizer, beam_size=3, alpha=2.0, max_extra_length=6, early_stopping=rule)
        _, scores = run(translator, sentences)
        source_ids = translator.source_ids(tf.constant(sentences))
        _, expected = beam_search(model, source_ids, beam_size=3, alpha=2.0, max_extra_length=6, early_stopping=rule)
        np.testing.assert_allclose(scores, expected.numpy(), rtol=1e-6, err_msg=rule)
        outputs[rule] = scores
    differ = np.abs(outputs["exact"] - outputs["k_finished"]) > 1e-6
    assert differ.any()
    assert np.all(outputs["exact"][differ] > outputs["k_finished"][differ])  # the exact search finds better ones


@pytest.mark.parametrize("beam_size", [1, 2])
def test_bad_alpha_and_early_stopping_are_refused_whatever_the_search(tokenizer, beam_size):
    """Greedy search and sampling divide their scores by the length penalty too: a negative alpha would
    multiply them."""
    from keras_transformer.errors import ParameterError

    model = Transformer(TransformerConfig.tiny(vocab_size=tokenizer.vocab_size, d_model=32, d_ff=64))
    for options, message in (
        (dict(alpha=-1.0), "^alpha must be >= 0 and finite, got -1.0"),
        (dict(alpha=float("inf")), "^alpha must be >= 0 and finite, got inf"),
        (dict(early_stopping="never"), "^early_stopping must be one of exact, k_finished, got 'never'"),
    ):
        with pytest.raises(ParameterError, match=message):
            Translator(model, tokenizer, beam_size=beam_size, **options)
