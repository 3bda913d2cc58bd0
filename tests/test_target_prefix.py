"""Target prefixes (`target_prefix`): each output starts with given tokens, and the search continues them.

The searches (greedy, beam with all its n-best rows, sampling) first: every
output starts with its prefix, a score is the log-probability of the whole
output as forced decoding (`score_outputs`) gives it, and a search without
prefixes is the one it was (same outputs, no prefix op in its graph). An
untrained model says "2 2 2 ..." whatever it reads, so the prefixes here (other
tokens) are never what the search would choose on its own.
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.decoding import (
    beam_search,
    greedy_search,
    length_penalty,
    make_decode_fn,
    sampling_search,
    score_outputs,
)
from keras_transformer.errors import ParameterError

EOS = 3
MAX_LENGTH = 12
SOURCES = [[5, 6, 7, 3], [8, 9, 3], [4, 4, 4, 10, 3], [11, 3]]
PREFIXES = [[7, 7, 9], [], [11], [4, 0, 6]]  # none for sentence 1; a 0 forces nothing at its position


def tiny_model(vocab_size=12, dtype=None):
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(vocab_size=vocab_size, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    model = Transformer(config)
    ids = np.full((1, 3), 5, np.int32)
    model((ids, ids))
    if dtype is None:
        return model
    other = Transformer(config, dtype=dtype)
    other.set_weights(model.get_weights())
    return other


def padded(rows, width=None):
    out = np.zeros((len(rows), width or max(1, max(len(r) for r in rows))), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out


def unpad(row):
    row = np.asarray(row)
    return row[row != 0].tolist()


SEARCHES = {
    "greedy": lambda model, sources, **options: greedy_search(model, sources, **options),
    "beam": lambda model, sources, **options: beam_search(model, sources, return_all=True, **options),
    "sampling": lambda model, sources, **options: sampling_search(model, sources, seed=7, **options),
}


SEARCH_FUNCTIONS = {"greedy": greedy_search, "beam": beam_search, "sampling": sampling_search}


def rows_of(token_ids):
    """`[B, L]` or `[B, K, L]` -> per sentence, its list of output rows (padding kept, as a list each)."""
    token_ids = np.asarray(token_ids)
    if token_ids.ndim == 2:
        token_ids = token_ids[:, None]
    return [[row.tolist() for row in hypotheses] for hypotheses in token_ids]


def starts_with(row, prefix):
    """Whether `row` holds every forced token of `prefix` (a list, 0: free) at its position."""
    return len(row) >= len(prefix) and all(p == 0 or row[t] == p for t, p in enumerate(prefix))


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def sources():
    return padded(SOURCES)


@pytest.fixture(scope="module")
def prefixes():
    return padded(PREFIXES)


# ----------------------------------------------------------------------------------
# The searches
# ----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_every_output_starts_with_its_prefix(model, sources, prefixes, method):
    free, _ = SEARCHES[method](model, sources, max_length=MAX_LENGTH)
    assert not any(starts_with(row, prefix) for rows, prefix in zip(rows_of(free), PREFIXES) if prefix for row in rows)
    token_ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes)
    for rows, prefix in zip(rows_of(token_ids), PREFIXES):
        for row in rows:  # every hypothesis of beam search
            assert starts_with(row, prefix), (row, prefix)
            assert EOS not in row[: len(prefix)] and 0 not in row[: len(prefix)]
    assert np.all(np.asarray(scores) > -1e6)  # real hypotheses, none a masked one


def test_n_best_hypotheses_are_distinct(model, sources, prefixes):
    """Step 0's K copies of the start token leave one hypothesis to carry the prefix, not K equal ones."""
    token_ids, scores = beam_search(model, sources, max_length=MAX_LENGTH, target_prefix=prefixes, return_all=True)
    for rows in rows_of(token_ids):
        assert len({tuple(unpad(row)) for row in rows}) == len(rows), rows
    assert np.all(np.diff(scores.numpy(), axis=1) <= 0)  # best first


@pytest.mark.parametrize("early_stopping", ["exact", "k_finished"])
def test_a_prefix_as_long_as_the_output_leaves_one_hypothesis(model, sources, early_stopping):
    """Every token is forced: one hypothesis exists. The other K-1 entries are padding scored NEG_INF, not
    the start's placeholder hypotheses finished at the length limit (the prefix cut short, scored -8e8)."""
    prefix = np.array([[7, 7, 9]] * len(sources), np.int32)
    token_ids, scores = beam_search(
        model, sources, max_length=3, target_prefix=prefix, return_all=True, early_stopping=early_stopping
    )
    token_ids, scores = np.asarray(token_ids), np.asarray(scores)
    assert (token_ids[:, 0] == prefix).all() and (scores[:, 0] > -1e6).all()
    assert (token_ids[:, 1:] == 0).all() and (scores[:, 1:] == -1e9).all()


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_scores_are_the_log_probability_of_the_whole_output(model, sources, prefixes, method):
    """Greedy and sampling give log P(Y | X), beam search log P / lp(|Y|): the prefix is scored, not skipped."""
    alpha = 0.6
    options = dict(alpha=alpha) if method == "beam" else {}
    token_ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes, **options)
    token_ids, scores = np.asarray(token_ids), np.asarray(scores)
    k = token_ids.shape[1] if token_ids.ndim == 3 else 1
    outputs = token_ids.reshape(-1, token_ids.shape[-1])
    log_probs, lengths = score_outputs(model, np.repeat(sources, k, axis=0), outputs)
    expected = log_probs.numpy()
    if method == "beam":
        expected = expected / length_penalty(lengths, alpha).numpy()
    np.testing.assert_allclose(scores.reshape(-1), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
def test_a_zero_prefix_changes_nothing(model, sources, method):
    """Rows of padding force nothing: the outputs and scores of the search without prefixes."""
    ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH)
    zeros = np.zeros((4, 3), np.int32)
    zero_ids, zero_scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=zeros)
    np.testing.assert_array_equal(ids.numpy(), zero_ids.numpy())
    np.testing.assert_array_equal(scores.numpy(), zero_scores.numpy())


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_sentences_decode_in_a_mixed_batch_as_alone(model, sources, prefixes, method):
    """Sentences with and without prefixes in one batch each get what they get alone (without: no prefix at all)."""
    ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes)
    for b, prefix in enumerate(PREFIXES):
        source = np.asarray(unpad(sources[b]))[None]
        options = dict(target_prefix=np.asarray([prefix])) if prefix else {}
        alone_ids, alone_scores = SEARCHES[method](model, source, max_length=MAX_LENGTH, **options)
        assert [[unpad(r) for r in rows] for rows in rows_of(ids[b : b + 1])] == [
            [unpad(r) for r in rows] for rows in rows_of(alone_ids)
        ]
        np.testing.assert_allclose(scores[b], alone_scores[0], rtol=1e-5, atol=1e-5)


def test_sampling_draws_the_same_for_the_sentences_without_prefix(model, sources, prefixes):
    """A seeded draw depends on the sentence's row and step: the unprefixed rows draw what they drew without."""
    ids, scores = SEARCHES["sampling"](model, sources, max_length=MAX_LENGTH)
    prefixed_ids, prefixed_scores = SEARCHES["sampling"](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes)
    np.testing.assert_array_equal(unpad(ids[1]), unpad(prefixed_ids[1]))
    assert scores[1] == prefixed_scores[1]


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_cached_and_uncached_searches_agree(model, sources, prefixes, method):
    cached_ids, cached_scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes)
    ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes, use_cache=False)
    np.testing.assert_array_equal(cached_ids.numpy(), ids.numpy())
    np.testing.assert_allclose(cached_scores.numpy(), scores.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_xla_decodes_as_the_plain_graph(model, sources, prefixes, method):
    options = dict(max_length=MAX_LENGTH, **({"return_all": True} if method == "beam" else {}))
    plain = make_decode_fn(model, method, with_target_prefix=True, **options)(sources, prefixes)
    compiled = make_decode_fn(model, method, jit_compile=True, with_target_prefix=True, **options)(sources, prefixes)
    np.testing.assert_array_equal(plain[0].numpy(), compiled[0].numpy())
    np.testing.assert_allclose(plain[1].numpy(), compiled[1].numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_bfloat16_outputs_start_with_their_prefix(sources, prefixes, method):
    model = tiny_model(dtype="bfloat16")
    options = dict(alpha=0.0) if method == "beam" else {}
    token_ids, scores = SEARCHES[method](model, sources, max_length=MAX_LENGTH, target_prefix=prefixes, **options)
    for rows, prefix in zip(rows_of(token_ids), PREFIXES):
        assert all(starts_with(row, prefix) for row in rows)
    token_ids = np.asarray(token_ids)
    k = token_ids.shape[1] if token_ids.ndim == 3 else 1
    log_probs, _ = score_outputs(model, np.repeat(sources, k, axis=0), token_ids.reshape(-1, token_ids.shape[-1]))
    np.testing.assert_allclose(np.asarray(scores).reshape(-1), log_probs.numpy(), atol=0.1)


def test_prefix_wins_over_min_length_and_blocking(model, sources):
    """A forced token is taken even where blocking (here of every repeated token) would refuse it."""
    prefixes = padded([[7, 7, 7]] * len(SOURCES))
    for method in ("greedy", "beam", "sampling"):
        token_ids, scores = SEARCHES[method](
            model, sources, max_length=MAX_LENGTH, target_prefix=prefixes, no_repeat_ngram_size=1, min_length=5
        )
        assert np.all(np.asarray(scores) > -1e6), method  # scored by the model, not as a blocked token
        for rows in rows_of(token_ids):
            for row in rows:
                assert row[:3] == [7, 7, 7] and EOS not in row[:5], (method, row)


# ----------------------------------------------------------------------------------
# Without prefixes: the search it was
# ----------------------------------------------------------------------------------


def graph_ops(concrete):
    """Op types of a concrete function's graph and of every function in its library (the while loop's body)."""
    graph = concrete.graph.as_graph_def()
    ops = collections.Counter(node.op for node in graph.node)
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


@pytest.mark.parametrize("method", ["greedy", "beam", "sampling"])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_without_prefixes_no_prefix_op_is_in_the_graph(model, monkeypatch, method, jit_compile):
    """The default search never calls the prefix code (a Python-level branch): same ops as `target_prefix=None`."""
    from keras_transformer.decoding import loops, search, tokens

    options = dict(min_length=2, max_length=8)
    prefixed = make_decode_fn(model, method, jit_compile, with_target_prefix=True, **options)
    on = graph_ops(prefixed.get_concrete_function())

    def refuse(*args, **kwargs):
        raise AssertionError("prefix code called without prefixes")

    for module, name in ((loops, "checked_prefix"), (loops, "prefix_token_at"), (tokens, "force_tokens")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(search, "check_target_prefix", refuse)
    default = graph_ops(make_decode_fn(model, method, jit_compile, **options).get_concrete_function())
    spec = tf.TensorSpec([None, None], tf.int32)
    explicit = tf.function(
        lambda source_ids: SEARCH_FUNCTIONS[method](model, source_ids, target_prefix=None, **options),
        input_signature=[spec],
        jit_compile=jit_compile,
        autograph=False,
    )
    assert graph_ops(explicit.get_concrete_function()) == default
    assert sum(on.values()) > sum(default.values())
    if not jit_compile:  # the prefix check; XLA would ignore it
        assert "Assert" not in default and on["Assert"] >= 1


# ----------------------------------------------------------------------------------
# Bad prefixes
# ----------------------------------------------------------------------------------


def test_bad_prefixes_are_one_line_errors_naming_target_prefix(model, sources):
    def error(prefixes, **options):
        with pytest.raises(ParameterError) as caught:
            greedy_search(model, sources, target_prefix=prefixes, **options)
        assert caught.value.parameter == "target_prefix" and "\n" not in str(caught.value)
        return str(caught.value)

    assert "longer than its sentence's maximum output length 4" in error(padded([[5] * 5] * 4), max_length=4)
    # Without max_length, a sentence's limit is its source length + max_extra_length: 2 + 3 for sentence 3.
    too_long = padded([[], [], [], [5] * 6])
    assert "row 3: 6 tokens" in error(too_long, max_extra_length=3)
    greedy_search(model, sources, target_prefix=padded([[], [], [], [5] * 5]), max_extra_length=3)  # fits exactly
    assert "end token 3" in error(padded([[5, EOS]] * 4))
    assert error(padded([[5, -1]] * 4)).startswith("target_prefix row 0, position 1: id -1; allowed: ids in [0, ")
    assert "has 2 rows for 4 sentences" in error(padded([[5], [6]]))
    assert "integer" in error(np.zeros((4, 2), np.float32))
    with pytest.raises(TypeError, match="target_prefix"):
        make_decode_fn(model, "greedy", target_prefix=np.zeros((4, 2)))


def test_a_graph_refuses_a_prefix_longer_than_the_output(model, sources):
    decode = make_decode_fn(model, "beam", max_length=4, with_target_prefix=True)
    decode(sources, padded([[5] * 4] * 4))
    with pytest.raises(tf.errors.InvalidArgumentError, match="target_prefix: a prefix is longer"):
        decode(sources, padded([[5] * 5] * 4))
    with pytest.raises(tf.errors.InvalidArgumentError, match="target_prefix: needs one row per sentence"):
        decode(sources, padded([[5]]))


# ----------------------------------------------------------------------------------
# Text: the Translator, the command line and the SavedModel
# ----------------------------------------------------------------------------------

SENTENCES = [
    "A dog runs on the beach.",
    "Two men are talking in front of a building.",
    "",
    "A girl in a red coat.",
    "People walk down the street.",
]
TEXT_PREFIXES = ["Ein Hund", "", "Zwei", "Ein Mädchen mit", "Leute"]  # none for sentence 2; sentence 3 is blank
EXTRA = 8


@pytest.fixture(scope="module")
def translator(tiny_run_dir):
    from keras_transformer.inference.translator import Translator

    return Translator.from_run_dir(tiny_run_dir, beam_size=3, max_extra_length=EXTRA)


def check_starts(translations, prefixes=TEXT_PREFIXES, sentences=SENTENCES):
    for sentence, prefix, text in zip(sentences, prefixes, translations):
        if not sentence:
            assert text == ""  # a blank input's translation, whatever its prefix
        else:
            assert text.startswith(prefix), (prefix, text)


@pytest.mark.parametrize("options", [dict(beam_size=3), dict(beam_size=1), dict(sampling=dict(top_k=0, seed=3))])
def test_translations_start_with_their_prefix(tiny_run_dir, translator, options):
    from keras_transformer.inference.translator import Translator

    if options != dict(beam_size=3):
        translator = Translator.from_run_dir(tiny_run_dir, max_extra_length=EXTRA, **options)
    free = translator.translate(SENTENCES)
    assert not any(text.startswith(prefix) for text, prefix in zip(free, TEXT_PREFIXES) if prefix and text)
    translations, scores = translator.translate(SENTENCES, return_scores=True, target_prefixes=TEXT_PREFIXES)
    check_starts(translations)
    # Sentences without a prefix are translated as without prefixes at all.
    unprefixed = [i for i, prefix in enumerate(TEXT_PREFIXES) if not prefix or not SENTENCES[i]]
    if "sampling" not in options:  # a seeded draw depends on the sentence's row in its batch
        assert [translations[i] for i in unprefixed] == [free[i] for i in unprefixed]
    assert scores[2] == 0.0


def test_n_best_translations_all_start_with_their_prefix(translator):
    lists = translator.translate(SENTENCES, n_best=3, target_prefixes=TEXT_PREFIXES)
    best = translator.translate(SENTENCES, target_prefixes=TEXT_PREFIXES)
    for entries, text in zip(lists, best):
        assert entries[0][0] == text
    for rank in range(3):
        check_starts([entries[rank][0] for entries in lists])
    # Different translations (subwords of an untrained model's may detokenize alike: not all 3 need differ).
    assert all(len({t for t, _ in entries}) > 1 for entries, s in zip(lists, SENTENCES) if s)


def test_prefixes_travel_with_their_sentences_through_the_batches(translator):
    """Batches of 2, sorted by length, decoded 2 at a time: each prefix still goes with its sentence."""
    alone = [
        translator.translate([sentence], target_prefixes=[prefix], return_scores=True)
        for sentence, prefix in zip(SENTENCES, TEXT_PREFIXES)
    ]
    batched = translator.translate(
        SENTENCES, target_prefixes=TEXT_PREFIXES, batch_size=2, workers=2, return_scores=True
    )
    assert batched[0] == [texts[0] for texts, _ in alone]
    np.testing.assert_allclose(batched[1], [scores[0] for _, scores in alone], atol=1e-5)


def test_translation_scores_are_the_whole_outputs_log_probability(translator):
    """The score the translator reports is log P(prefix + continuation) / lp(|Y|), as forced decoding gives it."""
    translations, scores = translator.translate(SENTENCES, return_scores=True, target_prefixes=TEXT_PREFIXES)
    rows = [i for i, sentence in enumerate(SENTENCES) if sentence]
    source_ids = translator.source_ids(tf.constant([SENTENCES[i] for i in rows]))
    prefix_ids = translator.tokenizer.tokenize(translator.normalized(tf.constant([TEXT_PREFIXES[i] for i in rows])))
    token_ids, _ = translator.search_with_prefix(source_ids, prefix_ids.to_tensor())
    assert texts_of(translator.tokenizer.detokenize(token_ids)) == [translations[i] for i in rows]
    log_probs, lengths = score_outputs(translator.model, source_ids, token_ids)
    expected = log_probs.numpy() / length_penalty(lengths, translator.alpha).numpy()
    np.testing.assert_allclose([scores[i] for i in rows], expected, rtol=1e-4, atol=1e-4)


def test_bfloat16_translations_start_with_their_prefix(tiny_run_dir):
    from keras_transformer.inference.translator import Translator

    translator = Translator.from_run_dir(tiny_run_dir, dtype="bfloat16", beam_size=3, max_extra_length=EXTRA)
    assert translator.model.compute_dtype == "bfloat16"
    check_starts(translator.translate(SENTENCES, target_prefixes=TEXT_PREFIXES))


def test_translate_strings_holds_no_prefix_search(translator):
    """The default signature traces the search without prefixes only: its graph is the one it was."""
    functions = translator.translate_strings.get_concrete_function().graph.as_graph_def().library.function
    names = [function.signature.name for function in functions]
    assert any("decode" in name for name in names)
    assert not any("with_prefix" in name for name in names), names


def texts_of(tensor):
    return [text.decode("utf-8") for text in tensor.numpy()]


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def run_translate(capsys, *args):
    from keras_transformer import cli

    capsys.readouterr()
    status = cli.main(["translate", *args])
    out = capsys.readouterr()
    return status, out.out.splitlines(), out.err


@pytest.fixture(scope="module")
def export_dir(translator, tmp_path_factory):
    from keras_transformer.inference.saved_model import export_saved_model

    return export_saved_model(translator, str(tmp_path_factory.mktemp("prefix_export") / "model"), n_best=2)


def test_library_command_line_and_saved_model_agree(translator, tiny_run_dir, export_dir, tmp_path, capsys):
    from keras_transformer.inference.translator import SavedModelTranslator

    expected, scores = translator.translate(SENTENCES, return_scores=True, target_prefixes=TEXT_PREFIXES)
    check_starts(expected)
    # The signature, loaded in process.
    loaded = tf.saved_model.load(export_dir)
    assert set(loaded.signatures) == {
        "serving_default",
        "translate_with_prefix",
        "translate_with_alignments",
        "translate_n_best",
    }
    served = loaded.signatures["translate_with_prefix"](
        inputs=tf.constant(SENTENCES), target_prefixes=tf.constant(TEXT_PREFIXES)
    )
    assert texts_of(served["translations"]) == expected
    np.testing.assert_allclose(served["scores"].numpy(), scores, atol=1e-5)
    # SavedModelTranslator, through the batching.
    saved = SavedModelTranslator(export_dir)
    assert saved.translate(SENTENCES, target_prefixes=TEXT_PREFIXES, batch_size=2) == expected
    # The command line, with the run directory and with the export.
    source = write_lines(tmp_path / "src.txt", SENTENCES)
    prefixes = write_lines(tmp_path / "prefixes.txt", TEXT_PREFIXES)
    for model in (tiny_run_dir, export_dir):
        flags = ["--beam", "3", "--max-extra-length", str(EXTRA)] if model == tiny_run_dir else []
        status, lines, _ = run_translate(
            capsys, "--model", model, *flags, "--input", source, "--target-prefix", prefixes, "--no-progress"
        )
        assert status == 0 and lines == expected, model
    status, lines, _ = run_translate(
        capsys, "--model", export_dir, "--target-prefix", prefixes, "--no-progress", *SENTENCES
    )
    assert status == 0 and lines == expected


def test_bfloat16_library_command_line_and_saved_model_agree(tiny_run_dir, tmp_path, capsys):
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.inference.translator import SavedModelTranslator, Translator

    options = dict(beam_size=3, max_extra_length=EXTRA)
    translator = Translator.from_run_dir(tiny_run_dir, dtype="bfloat16", **options)
    expected, scores = translator.translate(SENTENCES, return_scores=True, target_prefixes=TEXT_PREFIXES)
    check_starts(expected)
    path = export_saved_model(tiny_run_dir, str(tmp_path / "model"), dtype="bfloat16", warmup_sentences=None, **options)
    served, served_scores = SavedModelTranslator(path).translate(
        SENTENCES, return_scores=True, target_prefixes=TEXT_PREFIXES
    )
    assert served == expected
    np.testing.assert_allclose(served_scores, scores, atol=1e-5)
    source = write_lines(tmp_path / "src.txt", SENTENCES)
    prefixes = write_lines(tmp_path / "prefixes.txt", TEXT_PREFIXES)
    flags = ["--beam", "3", "--max-extra-length", str(EXTRA), "--precision", "bfloat16", "--no-progress"]
    status, lines, _ = run_translate(
        capsys, "--model", tiny_run_dir, *flags, "--input", source, "--target-prefix", prefixes
    )
    assert status == 0 and lines == expected


def test_help_documents_the_flag(capsys):
    from keras_transformer import cli

    with pytest.raises(SystemExit):
        cli.main(["translate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--target-prefix FILE" in text and "Default: none" in text


# ----------------------------------------------------------------------------------
# Bad prefixes of text
# ----------------------------------------------------------------------------------


def test_library_refuses_bad_prefixes_in_one_line(translator):
    with pytest.raises(ParameterError, match="has 2 prefixes for 5 sentences") as caught:
        translator.translate(SENTENCES, target_prefixes=["a", "b"])
    assert caught.value.parameter == "target_prefixes"
    long = " ".join(["Hund"] * 40)
    with pytest.raises(ParameterError, match=r"prefix 4: \d+ subwords, more than the \d+ tokens the translation of"):
        translator.translate(SENTENCES, target_prefixes=["", "", long, long, ""])  # the blank sentence 3 passes
    with pytest.raises(ParameterError, match="must be a str"):
        translator.translate(SENTENCES, target_prefixes=["", 5, "", "", ""])
    # The graph checks too, for clients of the exported signature.
    with pytest.raises(tf.errors.InvalidArgumentError, match="target prefix has more subwords"):
        translator.translate_with_prefix(tf.constant(["A dog."]), tf.constant([long]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="one target prefix per input"):
        translator.translate_with_prefix(tf.constant(["A dog.", "A cat."]), tf.constant(["Ein"]))


def test_command_line_refuses_bad_prefixes_in_one_line(translator, tiny_run_dir, export_dir, tmp_path, capsys):
    source = write_lines(tmp_path / "src.txt", SENTENCES)
    short = write_lines(tmp_path / "short.txt", TEXT_PREFIXES[:3])
    long = write_lines(tmp_path / "long.txt", ["", " ".join(["Hund"] * 40), "", "", ""])
    common = ["--max-extra-length", str(EXTRA), "--input", source, "--no-progress"]

    def error(*args):
        with pytest.raises(SystemExit) as caught:
            cli_args = ["--model", tiny_run_dir, *common, *args]
            run_translate(capsys, *cli_args)
        err = capsys.readouterr().err.strip()
        assert caught.value.code == 2 and len(err.splitlines()) == 1, err
        return err

    assert f"--target-prefix {short}: 3 lines for 5 input lines" in error("--target-prefix", short)
    assert f"--target-prefix {long}: prefix 2: " in error("--target-prefix", long)
    assert "--target-prefix -: standard input holds the sentences" in error("--target-prefix", "-", "--input", "-")
    missing = short.replace("short", "missing")
    with pytest.raises(SystemExit) as caught:
        run_translate(capsys, "--model", export_dir, "--input", source, "--target-prefix", missing)
    assert caught.value.code == 2 and f"--target-prefix {missing}: no such file." in capsys.readouterr().err
    prefixes = write_lines(tmp_path / "prefixes.txt", TEXT_PREFIXES)
    with pytest.raises(SystemExit) as caught:
        run_translate(capsys, "--model", export_dir, "--input", source, "--target-prefix", prefixes, "--n-best", "1")
    err = capsys.readouterr().err.strip()
    assert caught.value.code == 2 and f"--target-prefix {prefixes}: cannot be given with n_best" in err
