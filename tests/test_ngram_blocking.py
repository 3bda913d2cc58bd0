"""N-gram blocking (`no_repeat_ngram_size`) in greedy, beam and sampling search (keras_transformer.decoding).

An untrained model loops ("2 2 2 2 ..."): the tests first check that the
unblocked output repeats n-grams, then that the blocked one never does.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.decoding import beam_search, greedy_search, make_decode_fn, sampling_search
from keras_transformer.decoding.tokens import blocked_ngram_tokens
from keras_transformer.errors import ParameterError

BOS, EOS = 2, 3
A, B, C = 4, 5, 6


def tiny_model(vocab_size, seed=0, dtype=None):
    keras.utils.set_random_seed(seed)
    config = TransformerConfig.tiny(vocab_size=vocab_size, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    model = Transformer(config)
    ids = np.full((1, 3), 5, np.int32)
    model((ids, ids))
    if dtype is None:
        return model
    other = Transformer(config, dtype=dtype)
    other.set_weights(model.get_weights())
    return other


def padded(rows):
    out = np.zeros((len(rows), max(len(r) for r in rows)), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def unpad(row):
    row = np.asarray(row)
    return row[row != 0].tolist()


def repeated_ngrams(tokens, n):
    """How many of the n-grams of `tokens` (a list) occur earlier in it too."""
    grams = [tuple(tokens[j : j + n]) for j in range(len(tokens) - n + 1)]
    return len(grams) - len(set(grams))


def outputs(token_ids):
    """Every hypothesis of `token_ids [B, L]` or `[B, K, L]` as a list of tokens."""
    token_ids = np.asarray(token_ids)
    return [unpad(row) for row in token_ids.reshape(-1, token_ids.shape[-1])]


def teacher_forced_log_prob(model, source, tokens):
    target_in = np.array([[BOS] + tokens[:-1]], np.int32)
    logits = model((np.asarray(source, np.int32)[None], target_in))
    log_probs = tf.nn.log_softmax(logits[0]).numpy()
    return float(sum(log_probs[t, token] for t, token in enumerate(tokens)))


SEARCHES = {
    "greedy": lambda model, sources, **options: greedy_search(model, sources, **options),
    "beam": lambda model, sources, **options: beam_search(model, sources, return_all=True, **options),
    "sampling": lambda model, sources, **options: sampling_search(model, sources, seed=7, **options),
}


@pytest.fixture(scope="module")
def random_model():
    return tiny_model(vocab_size=12)


@pytest.fixture(scope="module")
def sources():
    rng = np.random.default_rng(0)
    return padded([rng.integers(4, 12, size=n).tolist() + [EOS] for n in (1, 8, 3, 12)])


# ----------------------------------------------------------------------------------
# The blocked tokens of one step
# ----------------------------------------------------------------------------------


def reference_blocked(row, i, n):
    """The tokens that would repeat an n-gram of `row[:i]` as token i (fairseq's and Hugging Face's rule)."""
    tokens = list(row[:i])
    last = tokens[i - n + 1 :] if n > 1 else []
    return {tokens[j + n - 1] for j in range(i - n + 1) if tokens[j : j + n - 1] == last}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_blocked_tokens_are_those_completing_an_earlier_ngram_of_the_row(n):
    """Each row of `[B, K, L]` is checked against its own tokens before position i only (the buffer's later
    positions hold other tokens here, as an unwritten one holds padding)."""
    rng = np.random.default_rng(n)
    vocab_size, length = 6, 10
    rows = rng.integers(1, 4, size=(3, 4, length)).astype(np.int32)  # few tokens: many repeats
    blocked_somewhere = False
    for i in range(length + 1):
        blocked = blocked_ngram_tokens(tf.constant(rows), tf.constant(i), n, vocab_size).numpy()  # [3, 4, V]
        assert blocked.shape == (3, 4, vocab_size)
        for b in range(3):
            for k in range(4):
                expected = reference_blocked(rows[b, k], i, n)
                assert set(np.flatnonzero(blocked[b, k])) == expected, (b, k, i)
                blocked_somewhere |= bool(expected)
    assert blocked_somewhere


# ----------------------------------------------------------------------------------
# The searches never repeat an n-gram
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
@pytest.mark.parametrize("n", [2, 3])
def test_no_output_repeats_an_ngram(random_model, sources, method, n):
    # Sampling at temperature 0.5 stays near the greedy path, which loops, whatever the seed's draws.
    options = dict(max_length=20, **({"temperature": 0.5} if method == "sampling" else {}))
    unblocked, _ = SEARCHES[method](random_model, sources, **options)
    assert sum(repeated_ngrams(tokens, n) for tokens in outputs(unblocked)) > 0  # the model does loop
    blocked, _ = SEARCHES[method](random_model, sources, no_repeat_ngram_size=n, **options)
    for tokens in outputs(blocked):  # every hypothesis, with beam search
        assert repeated_ngrams(tokens, n) == 0, tokens
        assert tokens and 0 not in tokens


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_blocked_searches_with_and_without_cache_agree(random_model, sources, method):
    cached_ids, cached_scores = SEARCHES[method](random_model, sources, max_length=20, no_repeat_ngram_size=2)
    ids, scores = SEARCHES[method](random_model, sources, max_length=20, no_repeat_ngram_size=2, use_cache=False)
    np.testing.assert_array_equal(cached_ids.numpy(), ids.numpy())
    np.testing.assert_allclose(cached_scores.numpy(), scores.numpy(), rtol=1e-5, atol=1e-5)


def test_scores_stay_the_models_log_probabilities(random_model, sources):
    """Blocking takes tokens away, it does not renormalize the others: a score is the output's log P."""
    ids, scores = greedy_search(random_model, sources, max_length=20, no_repeat_ngram_size=2)
    beam_ids, beam_scores = beam_search(
        random_model, sources, max_length=20, no_repeat_ngram_size=2, alpha=0.0, return_all=True
    )
    for b, source in enumerate(sources):
        source = unpad(source)
        tokens = unpad(ids[b])
        np.testing.assert_allclose(scores[b], teacher_forced_log_prob(random_model, source, tokens), rtol=1e-4)
        for k in range(beam_ids.shape[1]):
            tokens = unpad(beam_ids[b, k])
            expected = teacher_forced_log_prob(random_model, source, tokens)
            np.testing.assert_allclose(beam_scores[b, k], expected, rtol=1e-4)


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_sentences_decode_in_a_batch_as_alone(random_model, sources, method):
    """Padded sources and finished sentences (padding in the output buffer) block nothing in the others.

    Sampling draws from the top 1: a seeded draw depends on the sentence's batch, the best allowed token not."""
    options = dict(max_length=20, no_repeat_ngram_size=2, **({"top_k": 1} if method == "sampling" else {}))
    ids, scores = SEARCHES[method](random_model, sources, **options)
    for b, source in enumerate(sources):
        alone_ids, alone_scores = SEARCHES[method](random_model, np.asarray(unpad(source))[None], **options)
        assert outputs(ids[b : b + 1]) == outputs(alone_ids)
        np.testing.assert_allclose(scores[b], alone_scores[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_blocking_nothing_changes_nothing(random_model, sources, method):
    """With N longer than any output nothing is blocked: the outputs and scores of the unblocked search."""
    ids, scores = SEARCHES[method](random_model, sources, max_length=20)
    long_ids, long_scores = SEARCHES[method](random_model, sources, max_length=20, no_repeat_ngram_size=21)
    np.testing.assert_array_equal(ids.numpy(), long_ids.numpy())
    np.testing.assert_allclose(scores.numpy(), long_scores.numpy(), rtol=1e-5, atol=1e-5)
    off_ids, off_scores = SEARCHES[method](random_model, sources, max_length=20, no_repeat_ngram_size=0)
    np.testing.assert_array_equal(ids.numpy(), off_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), off_scores.numpy())


def graph_ops(decode):
    """Op types of a `tf.function`'s graph and of every function in its library (the while loop's body)."""
    graph = decode.get_concrete_function().graph.as_graph_def()
    ops = collections.Counter(node.op for node in graph.node)
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_off_puts_nothing_in_the_graph(random_model, method, jit_compile):
    options = dict(min_length=2, max_length=8)
    default = graph_ops(make_decode_fn(random_model, method, jit_compile, **options))
    off = graph_ops(make_decode_fn(random_model, method, jit_compile, no_repeat_ngram_size=0, **options))
    on = graph_ops(make_decode_fn(random_model, method, jit_compile, no_repeat_ngram_size=2, **options))
    assert off == default
    assert "TensorScatterAdd" not in off and on["TensorScatterAdd"] >= 1  # blocking's scatter
    assert sum(on.values()) > sum(off.values())


# ----------------------------------------------------------------------------------
# Per hypothesis, the start token, XLA, bfloat16, refused values
# ----------------------------------------------------------------------------------


class TableModel:
    """A stand-in for `Transformer` whose `P(next | previous token, step)` is a table given by the test."""

    def __init__(self, rules, vocab_size=8, steps=16):
        probs = np.full((vocab_size, steps, vocab_size), 1e-3)
        probs[:, :, EOS] = 0.5  # what no rule says: end
        for (previous, step), nexts in rules.items():
            probs[previous, step] = 1e-3
            for token, p in nexts.items():
                probs[previous, step, token] = p
        probs /= probs.sum(-1, keepdims=True)
        self.table = tf.constant(np.log(probs), tf.float32)

    def encode(self, source_ids, training=None):
        return tf.zeros(tf.concat([tf.shape(source_ids), [2]], 0))

    def init_cache(self, memory, max_length):
        batch = tf.shape(memory)[0]
        return {"self": [(tf.zeros([batch, 1, max_length, 2]),) * 2], "cross": [(memory, memory)]}

    def decode_step(self, target_ids, memory, source_ids, cache, cache_index, positions=None, self_attention_mask=None):
        steps = positions + tf.zeros_like(target_ids)
        return tf.gather_nd(self.table, tf.stack([target_ids, steps], -1)), cache


def test_beam_hypotheses_do_not_block_each_other():
    """Two hypotheses hold the bigram "a b": the one whose own tokens hold it may not repeat it, the other
    may still make it."""
    model = TableModel(
        {
            (BOS, 0): {A: 0.5, C: 0.45},  # [a] and [c]
            (A, 1): {B: 0.9},  # [a b]
            (C, 1): {A: 0.9},  # [c a]
            (B, 2): {A: 0.9},  # [a b a]
            (A, 2): {B: 0.9},  # [c a b]: "a b" is the other hypothesis's, not its own
            (A, 3): {B: 0.6, EOS: 0.35},  # [a b a b], or [a b a eos] once "a b" is blocked
            (B, 3): {EOS: 0.9},  # [c a b eos]
        }
    )
    source = np.array([[7, 7]], np.int32)
    ids, _ = beam_search(model, source, beam_size=2, alpha=0.0, return_all=True, max_length=8)
    assert outputs(ids) == [[C, A, B, EOS], [A, B, A, B, EOS]]  # best first
    ids, _ = beam_search(model, source, beam_size=2, alpha=0.0, return_all=True, max_length=8, no_repeat_ngram_size=2)
    assert outputs(ids) == [[C, A, B, EOS], [A, B, A, EOS]]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_the_start_token_is_no_output_token(method):
    """An output may begin with the start token's id and repeat it once: "<s> <s>" is one bigram of the output
    only if the start token counted."""
    model = TableModel({(BOS, 0): {BOS: 0.9}, (BOS, 1): {BOS: 0.9}, (BOS, 2): {EOS: 0.9}})
    ids, _ = SEARCHES[method](model, np.array([[7, 7]], np.int32), max_length=8, no_repeat_ngram_size=2)
    assert outputs(ids)[0] == [BOS, BOS, EOS]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_jit_compile_matches_graph(random_model, sources, method):
    options = dict(max_length=20, no_repeat_ngram_size=2)
    ids, scores = SEARCHES[method](random_model, sources, **options)
    extra = dict(return_all=True) if method == "beam" else {}
    decode = make_decode_fn(random_model, method, jit_compile=True, **options, **extra)
    xla_ids, xla_scores = decode(tf.constant(sources))
    np.testing.assert_array_equal(xla_ids.numpy()[..., : ids.shape[-1]], ids.numpy())
    np.testing.assert_allclose(xla_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-4)


def test_jit_compiled_sampling_repeats_no_bigram(random_model, sources):
    # XLA draws other samples than the plain graph: the property, not equality.
    decode = make_decode_fn(random_model, "sampling", jit_compile=True, seed=5, max_length=20, no_repeat_ngram_size=2)
    for tokens in outputs(decode(tf.constant(sources))[0]):
        assert repeated_ngrams(tokens, 2) == 0, tokens


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_bfloat16_searches_repeat_no_bigram(sources, method):
    """A bfloat16 model (its vocabulary large enough for the bfloat16 top-k) loops, and blocked does not."""
    model = tiny_model(vocab_size=1200, dtype="bfloat16")
    options = dict(max_length=20, top_k=2) if method == "sampling" else dict(max_length=20)  # 1200 tokens: a few
    unblocked, _ = SEARCHES[method](model, sources, **options)
    assert sum(repeated_ngrams(tokens, 2) for tokens in outputs(unblocked)) > 0
    blocked, scores = SEARCHES[method](model, sources, **options, no_repeat_ngram_size=2)
    assert scores.dtype == tf.float32 and np.isfinite(scores.numpy()).all()
    for tokens in outputs(blocked):
        assert repeated_ngrams(tokens, 2) == 0, tokens


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_when_blocking_and_min_length_leave_no_token_the_sentence_ends(random_model, sources, method):
    """N = 1 uses each token once; past the 10 tokens of this vocabulary that the model may use, only the end
    token is left, and `min_length` yields to it."""
    ids, scores = SEARCHES[method](random_model, sources, max_length=30, min_length=25, no_repeat_ngram_size=1)
    assert np.isfinite(scores.numpy()).all()
    for tokens in outputs(ids):
        assert tokens[-1] == EOS and len(tokens) == 11
        assert len(set(tokens)) == len(tokens) and 0 not in tokens


@pytest.mark.parametrize("value", [-1, 1.5, True, "2", None])
def test_bad_values_are_refused_by_name(random_model, sources, value):
    for call in (
        lambda: greedy_search(random_model, sources, no_repeat_ngram_size=value),
        lambda: beam_search(random_model, sources, no_repeat_ngram_size=value),
        lambda: sampling_search(random_model, sources, no_repeat_ngram_size=value),
        lambda: make_decode_fn(random_model, "beam", no_repeat_ngram_size=value),
    ):
        with pytest.raises(ParameterError, match="no_repeat_ngram_size must be a non-negative integer") as raised:
            call()
        assert raised.value.parameter == "no_repeat_ngram_size"


# ----------------------------------------------------------------------------------
# Translator, command line, SavedModel
# ----------------------------------------------------------------------------------

SENTENCES = ["A dog runs on the beach.", "Two men are talking.", "", "A girl in a red coat plays in the snow."]
EXTRA = 12  # output up to the source length + 12 subwords


def blocking_translator(run_dir, n, **options):
    from keras_transformer.inference.translator import Translator

    return Translator.from_run_dir(run_dir, max_extra_length=EXTRA, no_repeat_ngram_size=n, **options)


SEARCH_OPTIONS = {
    "beam": (dict(beam_size=4), lambda model, ids, **o: beam_search(model, ids, beam_size=4, alpha=0.6, **o)),
    "greedy": (dict(beam_size=1), greedy_search),
    "sampling": (
        dict(sampling=dict(top_k=3, seed=1)),
        lambda model, ids, **o: sampling_search(model, ids, top_k=3, seed=1, **o),
    ),
}


@pytest.mark.parametrize("method", SEARCH_OPTIONS)
def test_translator_blocks_as_the_library_does(tiny_run_dir, method):
    """The Translator's search repeats no bigram of subwords where the unblocked one does, and gives the
    library search's tokens."""
    options, library_search = SEARCH_OPTIONS[method]
    unblocked = blocking_translator(tiny_run_dir, 0, **options)
    translator = blocking_translator(tiny_run_dir, 2, **options)
    sentences = [s for s in SENTENCES if s]
    source_ids = translator.source_ids(tf.constant(sentences))
    ids, _ = translator.search(source_ids)
    assert sum(repeated_ngrams(tokens, 2) for tokens in outputs(unblocked.search(source_ids)[0])) > 0
    assert all(repeated_ngrams(tokens, 2) == 0 for tokens in outputs(ids))
    library_ids, _ = library_search(translator.model, source_ids, max_extra_length=EXTRA, no_repeat_ngram_size=2)
    assert outputs(library_ids) == outputs(ids)
    if method != "sampling":  # `translate` sorts sentences by length, and a draw depends on the row
        texts = [t.decode("utf-8") for t in translator.tokenizer.detokenize(ids).numpy()]
        assert translator.translate(sentences) == texts


@pytest.fixture(scope="module")
def expected(tiny_run_dir):
    """The translations of SENTENCES by a Translator with beam 4 and bigram blocking, and without blocking."""
    return {n: blocking_translator(tiny_run_dir, n).translate(SENTENCES) for n in (0, 2)}


def test_translate_and_evaluate_commands_block(tiny_run_dir, expected, tmp_path, capsys):
    from keras_transformer import cli

    assert expected[2] != expected[0]
    common = ["--model", tiny_run_dir, "--max-extra-length", str(EXTRA), "--no-repeat-ngram-size", "2"]
    capsys.readouterr()
    assert cli.main(["translate", *common, "--no-progress", *SENTENCES]) == 0
    assert capsys.readouterr().out.splitlines() == expected[2]
    src, output = tmp_path / "src.en", tmp_path / "out.de"
    src.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    argv = ["evaluate", *common, "--src", str(src), "--ref", str(src), "--output", str(output), "--no-progress"]
    assert cli.main(argv) == 0
    assert output.read_text(encoding="utf-8").splitlines() == expected[2]


def test_export_fixes_and_records_blocking(tiny_run_dir, expected, tmp_path, capsys):
    import json

    from keras_transformer import cli
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.inference.translator import SavedModelTranslator

    def info(path):
        with open(f"{path}/assets/export.json") as f:
            return json.load(f)["decoding"]

    base = str(tmp_path / "served")
    argv = ["export", "--model", tiny_run_dir, "--output", base, "--max-extra-length", str(EXTRA), "--no-warmup"]
    assert cli.main([*argv, "--no-repeat-ngram-size", "2"]) == 0
    path = capsys.readouterr().out.splitlines()[-1]
    assert info(path)["no_repeat_ngram_size"] == 2
    assert SavedModelTranslator(path).translate(SENTENCES) == expected[2]
    # Re-exported: kept unless given; 0 turns it off, and an export without blocking records nothing.
    again = export_saved_model(path, base, warmup_sentences=None)
    assert info(again)["no_repeat_ngram_size"] == 2
    assert SavedModelTranslator(again).translate(SENTENCES) == expected[2]
    assert cli.main(["export", "--model", again, "--output", base, "--no-repeat-ngram-size", "0", "--no-warmup"]) == 0
    off = capsys.readouterr().out.splitlines()[-1]
    assert "no_repeat_ngram_size" not in info(off)
    assert SavedModelTranslator(off).translate(SENTENCES) == expected[0]


@pytest.mark.parametrize("command", ["translate", "evaluate", "export"])
def test_bad_flag_values_are_one_line_naming_the_flag(tiny_run_dir, tmp_path, command, capsys):
    from keras_transformer import cli

    src = tmp_path / "src.en"
    src.write_text("A dog.\n", encoding="utf-8")
    rest = {
        "translate": ["A dog."],
        "evaluate": ["--src", str(src), "--ref", str(src)],
        "export": ["--output", str(tmp_path / "out"), "--no-warmup"],
    }[command]
    for value, line in (
        (
            "-1",
            f"keras-transformer {command}: --no-repeat-ngram-size -1: must be a non-negative integer (0: off), got -1.",
        ),
        ("1.5", "argument --no-repeat-ngram-size: invalid int value: '1.5'"),
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as raised:
            cli.main([command, "--model", tiny_run_dir, "--no-repeat-ngram-size", value, *rest])
        assert raised.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(line)
    assert not (tmp_path / "out").exists()


def test_help_gives_the_default(capsys):
    from keras_transformer import cli

    for command in ("translate", "evaluate", "export"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "--no-repeat-ngram-size N never repeat an N-gram" in text and "default 0: off" in text, command
