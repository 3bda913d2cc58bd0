"""Word alignments (`inference.alignments`): a copy model aligns each word with itself, subwords fold into the words
of the text, and the library, the SavedModel and the command line give the same alignments.

The toy task: sentences of made-up words of the letters a-h, each of several
subwords of a 40-piece vocabulary (bare "▁" and "(" pieces included), and a
one-layer Transformer trained to copy them. Its alignment is known: target word
j is source word j.
"""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig, cli
from keras_transformer.errors import ParameterError
from keras_transformer.inference.alignments import (
    align_ids,
    alignment_layer_index,
    fold,
    parse_alignment,
    pharaoh,
    piece_strings,
    word_membership,
)
from keras_transformer.special_ids import BOS_ID, EOS_ID

LETTERS = list("abcdefgh")
STEPS, BATCH = 300, 64


def make_words(rng):
    return sorted({"".join(rng.choice(LETTERS, size=rng.integers(2, 7))) for _ in range(40)})


def sentence(rng, words, low=2, high=5):
    """`low` to `high` different words, sometimes a "(" between them and a "." at the end."""
    chosen = [str(w) for w in rng.choice(words, size=rng.integers(low, high + 1), replace=False)]
    if rng.random() < 0.3:
        chosen[-1] += "."
    if rng.random() < 0.2:
        chosen.insert(int(rng.integers(1, len(chosen))), "(")
    return " ".join(chosen)


def padded(rows, width):
    out = np.zeros((len(rows), width), np.int32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def diagonal(text):
    return " ".join(f"{i}-{i}" for i in range(len(text.split())))


@pytest.fixture(scope="module")
def copy_task(tmp_path_factory):
    """`(run_dir, words)`: a run directory (spm.model, model.keras, config.json) of a one-layer copy model."""
    from keras_transformer.data.tokenizer import train_tokenizer

    rng = np.random.default_rng(0)
    words = make_words(rng)
    texts = [sentence(rng, words) for _ in range(3000)]
    run_dir = tmp_path_factory.mktemp("copy_run")
    tokenizer = train_tokenizer(texts, run_dir / "spm", vocab_size=40, byte_fallback=False)
    rows = tokenizer.tokenize(tf.constant(texts)).to_list()
    rows = (rows * (STEPS * BATCH // len(rows) + 1))[: STEPS * BATCH]
    width = max(map(len, rows)) + 1
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(
        tokenizer.vocab_size, num_layers=1, d_model=64, num_heads=4, d_ff=128, dropout=0.0, max_length=40
    )
    model = Transformer(config)
    schedule = keras.optimizers.schedules.PolynomialDecay(5e-3, STEPS, 2.5e-4)
    model.compile(optimizer=keras.optimizers.Adam(schedule, beta_2=0.98))
    source, target_out = padded([r + [EOS_ID] for r in rows], width), padded([r + [EOS_ID] for r in rows], width)
    model.fit((source, padded([[BOS_ID] + r for r in rows], width)), target_out, batch_size=BATCH, verbose=0)
    model.save(run_dir / "model.keras")
    (run_dir / "config.json").write_text(
        json.dumps({"model": config.to_dict(), "tokenizer": "spm.model", "final_model": "model.keras"})
    )
    return str(run_dir), words


OPTIONS = dict(beam_size=2, max_extra_length=4)


@pytest.fixture(scope="module")
def translator(copy_task):
    from keras_transformer.inference.translator import Translator

    return Translator.from_run_dir(copy_task[0], **OPTIONS)


# ----------------------------------------------------------------------------------
# The toy task whose alignment is known
# ----------------------------------------------------------------------------------


def test_a_copy_model_aligns_each_word_with_itself(copy_task, translator):
    rng = np.random.default_rng(1)
    sources = [sentence(rng, copy_task[1]) for _ in range(100)]
    translations, alignments = translator.translate(sources, alignments=True)
    copied = [(s, a) for s, t, a in zip(sources, translations, alignments) if t == s]
    assert len(copied) >= 0.9 * len(sources), f"only {len(copied)} of {len(sources)} sentences copied"
    assert [a for _, a in copied] == [diagonal(s) for s, _ in copied]


# ----------------------------------------------------------------------------------
# Subwords folded into words
# ----------------------------------------------------------------------------------


def words_of(pieces):
    """The word of each subword, as `word_membership` finds them: `[[w, ...] per subword], count`."""
    membership, count = word_membership(tf.constant([pieces]))
    return [np.flatnonzero(row).tolist() for row in membership.numpy()[0]], int(count[0])


@pytest.mark.parametrize(
    "pieces, words, text",
    [
        (["▁Ein", "▁H", "und", "▁läuft", "."], [[0], [1], [1], [2], [2]], "Ein Hund läuft."),
        (["▁a", "▁", "(", "b", ")", "▁", ",", "x"], [[0], [1], [1], [1], [1], [2], [2], [2]], "a (b) ,x"),
        (["a", "b", "▁c"], [[0], [0], [1]], "ab c"),  # no word marker in front: the first subword still starts one
        (["▁a", "▁", "▁", "▁b", "▁"], [[0], [1], [1], [1], []], "a   b "),  # runs of spaces; a trailing one
        (["▁2", "\xa0", "F", "inger"], [[0], [1], [1], [1]], "2\xa0Finger"),  # a no-break space separates words
        (["▁2\xa0F", "inger"], [[0, 1], [1]], "2\xa0Finger"),  # a subword across two words belongs to both
        (["▁a", "▁\u2047▁", "b"], [[0], [1], [2]], "a \u2047 b"),  # <unk> as SentencePiece detokenizes it
        (["", "▁a", "", ""], [[], [0], [], []], "a"),  # padding, start and end tokens
        (["", ""], [[], []], ""),
    ],
)
def test_subwords_fold_into_the_words_str_split_finds(pieces, words, text):
    found, count = words_of(pieces)
    assert found == words and count == len(text.split())


def test_words_are_those_of_the_detokenized_multi30k_text(spm500):
    """Every sentence of a Multi30k sample (no-break spaces, punctuation, bare "▁" subwords): the folded subwords
    spell the words `str.split()` finds in the detokenized text."""
    from keras_transformer.data import corpora
    from keras_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(spm500)
    texts = corpora.read_lines("train", "de")[:1500] + corpora.read_lines("train", "en")[:500]
    texts += [line for line in corpora.read_lines("train", "de") if "\xa0" in line][:20]
    ids = tokenizer.tokenize(tf.constant(texts))
    ids = tf.concat([ids, tf.fill([ids.nrows(), 1], EOS_ID)], axis=1).to_tensor()
    pieces = piece_strings(tokenizer, ids).numpy()
    membership, counts = (x.numpy() for x in word_membership(tf.constant(pieces)))
    assert "▁".encode() in set(pieces.reshape(-1)) and any("\xa0" in t for t in texts)
    for row, text in enumerate(tokenizer.detokenize(ids).numpy()):
        words = text.decode().split()
        assert counts[row] == len(words), text
        spelled = [b"".join(pieces[row][membership[row, :, w] > 0]).decode() for w in range(counts[row])]
        assert ["".join(s.replace("▁", " ").split()) for s in spelled] == words, text  # separators in front


def test_fold_sums_over_source_subwords_and_averages_over_target_subwords():
    """Source words [s0] [s1 s2] [s3], target words [t0 t1] [t2]: only the sum over a source word's subwords and
    the mean over a target word's give "2-0 1-1" (the first subword alone would give "1-0" or "0-1")."""
    attention = tf.constant(
        [
            [
                [0.05, 0.5, 0.05, 0.4],  # t0: summed, source word 1 (0.55); alone, word 0's target would be 1
                [0.05, 0.05, 0.05, 0.85],  # t1: source word 2
                [0.35, 0.3, 0.3, 0.05],  # t2: source word 1 summed (0.6), word 0 by its first subword (0.35)
            ]
        ]
    )
    source, source_words = word_membership(tf.constant([["▁a", "▁b", "c", "▁d"]]))
    target, target_words = word_membership(tf.constant([["▁x", "y", "▁z"]]))
    weights = fold(attention, source, target)
    np.testing.assert_allclose(weights.numpy()[0], [[0.05, 0.325, 0.625], [0.35, 0.6, 0.05]], atol=1e-6)
    assert pharaoh(weights, source_words, target_words).numpy()[0] == b"2-0 1-1"


def test_pharaoh_pairs_are_sorted_by_target_word_and_empty_without_words():
    weights = tf.constant([[[0.2, 0.8, 0.0], [0.5, 0.5, 0.0], [0.3, 0.2, 0.9]]] * 3)
    found = pharaoh(weights, tf.constant([2, 0, 3]), tf.constant([3, 2, 0])).numpy().tolist()
    assert found == [b"1-0 0-1 0-2", b"", b""]  # a tie goes to the first; padded words are never chosen
    assert parse_alignment("1-0 0-1 0-2") == [(1, 0), (0, 1), (0, 2)]


def reference_words(pieces):
    """Python's reading of the words of subwords: each subword's set of words, and the count."""
    begun, at_space, members = 0, True, []
    for piece in pieces:
        own = set()
        for char in piece.replace("▁", " "):
            if char.isspace():
                at_space = True
            else:
                begun, at_space = begun + (1 if at_space else 0), False
                own.add(begun - 1)
        members.append(own or {begun})  # only spaces: the word after them
    return [{w for w in m if w < begun} for m in members], begun


def reference_alignment(model, tokenizer, source_ids, token_ids, layer):
    """NumPy's alignment of one source and translation (ids without padding, each ending with the end token)."""
    target_in = np.asarray([[BOS_ID, *token_ids[:-1]]])
    attention = np.asarray(model.attention_weights(np.asarray([source_ids]), target_in).cross[layer])[0].mean(0)
    source, source_count = reference_words(tokenizer.pieces(source_ids[:-1]))
    target_pieces = tokenizer.pieces(token_ids[: token_ids.index(EOS_ID)] if EOS_ID in token_ids else token_ids)
    target, target_count = reference_words(target_pieces)
    pairs = []
    for j in range(target_count if source_count else 0):
        rows = [t for t, words in enumerate(target) if j in words]
        weights = [
            np.mean([sum(attention[t, s] for s, ws in enumerate(source) if i in ws) for t in rows])
            for i in range(source_count)
        ]
        pairs.append(f"{int(np.argmax(weights))}-{j}")
    return " ".join(pairs)


def test_alignments_are_those_of_a_plain_computation(copy_task, translator):
    """A random two-layer model, whose attention is anything but diagonal: the Translator (layer 0, in its graph)
    and `align_ids` (the last layer, eagerly) give what NumPy computes from `Transformer.attention_weights` of
    that layer, averaged over the heads."""
    from keras_transformer.inference.translator import Translator

    keras.utils.set_random_seed(3)
    config = TransformerConfig.tiny(translator.tokenizer.vocab_size, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    random = Translator(Transformer(config), translator.tokenizer, alignment_layer=0, **OPTIONS)
    rng = np.random.default_rng(2)
    sources = [sentence(rng, copy_task[1], 3, 6) for _ in range(6)]
    translations, alignments = random.translate(sources, alignments=True)
    source_ids = random.source_ids(tf.constant(sources))
    token_ids, _ = random.search(source_ids)
    last = align_ids(random.model, random.tokenizer, source_ids, token_ids, layer=-1).numpy()
    for source_row, token_row, first, second in zip(source_ids.numpy(), token_ids.numpy(), alignments, last):
        source_row, token_row = [int(x) for x in source_row if x], [int(x) for x in token_row if x]
        assert first == reference_alignment(random.model, random.tokenizer, source_row, token_row, 0)
        assert second.decode() == reference_alignment(random.model, random.tokenizer, source_row, token_row, -1)
    assert len(set(alignments)) > 1 and any(a != diagonal(t) for a, t in zip(alignments, translations))


# ----------------------------------------------------------------------------------
# The Translator: n-best lists, prefixes, ensembles, the default path
# ----------------------------------------------------------------------------------


def word_count(text):
    return len(text.split())


def check_pairs(alignment, source, translation):
    """One pair per word of the translation, in order, each naming a word of the source."""
    pairs = parse_alignment(alignment)
    assert [j for _, j in pairs] == list(range(word_count(translation) if word_count(source) else 0))
    assert all(0 <= i < word_count(source) for i, _ in pairs)


def test_n_best_lists_and_prefixes_are_aligned_too(copy_task, translator):
    rng = np.random.default_rng(4)
    sources = [sentence(rng, copy_task[1]) for _ in range(4)] + [""]
    best, aligned = translator.translate(sources, alignments=True)
    lists = translator.translate(sources, n_best=2, alignments=True)
    assert [entries[0][0] for entries in lists] == best and [entries[0][2] for entries in lists] == aligned
    for source, entries in zip(sources, lists):
        for text, _, alignment in entries:
            check_pairs(alignment, source, text)
    prefixes = [source.split()[0] if source else "" for source in sources]
    texts, alignments = translator.translate(sources, target_prefixes=prefixes, alignments=True)
    for source, prefix, text, alignment in zip(sources, prefixes, texts, alignments):
        assert text.startswith(prefix)
        check_pairs(alignment, source, text)
    assert [a for s, t, a in zip(sources, texts, alignments) if t == s] == [diagonal(t) for t in texts if t in sources]
    lists = translator.translate(sources, target_prefixes=prefixes, n_best=2, alignments=True)
    assert [entries[0][0] for entries in lists] == texts and [entries[0][2] for entries in lists] == alignments


def test_an_ensemble_of_the_model_with_itself_aligns_as_the_model(copy_task, translator):
    """Its attention is its members' weighted mean (fairseq averages an ensemble's attention too)."""
    from keras_transformer.ensemble import Ensemble
    from keras_transformer.inference.translator import Translator

    rng = np.random.default_rng(5)
    sources = [sentence(rng, copy_task[1], 4, 7) for _ in range(4)]
    ensemble = Translator(Ensemble([translator.model, translator.model]), translator.tokenizer, **OPTIONS)
    assert ensemble.translate(sources, alignments=True) == translator.translate(sources, alignments=True)


def test_without_alignments_nothing_of_them_is_traced(copy_task, monkeypatch):
    """The default signature, the prefix one and n-best lists never call the alignment code: their graphs are
    those they were."""
    from keras_transformer.inference import translator as module

    def refuse(*args, **kwargs):
        raise AssertionError("alignment code called without alignments")

    monkeypatch.setattr(module, "align_ids", refuse)
    fresh = module.Translator.from_run_dir(copy_task[0], **OPTIONS)
    assert fresh.translate(["abc de", ""], target_prefixes=["ab", ""]) and fresh.translate(["abc de"], n_best=2)
    fresh.translate_strings.get_concrete_function()
    functions = fresh.translate_strings.get_concrete_function().graph.as_graph_def().library.function
    assert not any("alignment" in function.signature.name for function in functions)
    with pytest.raises(AssertionError, match="alignment code called"):
        fresh.translate(["abc de"], alignments=True)


# ----------------------------------------------------------------------------------
# Bad layers
# ----------------------------------------------------------------------------------


def test_library_refuses_bad_layers_and_translators_without_alignments(translator):
    from keras_transformer.inference.litert import LiteRTTranslator
    from keras_transformer.inference.translator import Translator

    with pytest.raises(ParameterError, match=r"^alignment_layer must be between -1 and 0 \(the model's decoder has 1 "):
        Translator(translator.model, translator.tokenizer, alignment_layer=1)
    with pytest.raises(ParameterError, match="alignment_layer must be an integer, got 'last'"):
        alignment_layer_index(translator.model, "last")
    assert alignment_layer_index(translator.model, -1) == 0
    litert = LiteRTTranslator.__new__(LiteRTTranslator)  # what its translate checks before running the file
    litert.max_batch_size = 8
    with pytest.raises(ParameterError, match="^alignments cannot be given: a LiteRTTranslator gives no word alignment"):
        litert.translate(["abc"], alignments=True)


# ----------------------------------------------------------------------------------
# The SavedModel
# ----------------------------------------------------------------------------------


def texts_of(tensor):
    return [text.decode("utf-8") for text in tensor.numpy()]


def mixed_sentences(words):
    """Copies, longer sentences than the model saw (not aligned diagonally), unknown letters, a blank line."""
    rng = np.random.default_rng(6)
    return [sentence(rng, words) for _ in range(3)] + [sentence(rng, words, 7, 9) for _ in range(3)] + ["xyz ab", ""]


@pytest.fixture(scope="module")
def export_dir(translator, tmp_path_factory):
    from keras_transformer.inference.saved_model import export_saved_model

    return export_saved_model(translator, str(tmp_path_factory.mktemp("export") / "model"), warmup_sentences=None)


@pytest.fixture(scope="module")
def bfloat16(copy_task, tmp_path_factory):
    """`(translator, export)` in bfloat16, aligning with layer 0 (the only one, named by its index)."""
    from keras_transformer.inference.saved_model import export_saved_model
    from keras_transformer.inference.translator import Translator

    run_dir = copy_task[0]
    translator = Translator.from_run_dir(run_dir, dtype="bfloat16", alignment_layer=0, **OPTIONS)
    assert translator.model.compute_dtype == "bfloat16"
    path = str(tmp_path_factory.mktemp("bfloat16") / "model")
    return translator, export_saved_model(
        run_dir, path, dtype="bfloat16", alignment_layer=0, warmup_sentences=None, **OPTIONS
    )


def models(request, precision):
    """`(translator, export directory)` of `precision`."""
    if precision == "float32":
        return request.getfixturevalue("translator"), request.getfixturevalue("export_dir")
    return request.getfixturevalue("bfloat16")


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_library_and_saved_model_agree(copy_task, request, precision):
    """`translate(..., alignments=True)`, the Translator's graph, `align_ids` eagerly, the export's signature and
    `SavedModelTranslator` give the same translations, scores and alignments."""
    from keras_transformer.inference.translator import SavedModelTranslator

    translator, export = models(request, precision)
    sentences = mixed_sentences(copy_task[1])
    expected, scores, aligned = translator.translate(sentences, return_scores=True, alignments=True)
    assert aligned[-1] == "" and any(a != diagonal(t) for a, t in zip(aligned, expected) if t)
    graph = translator.translate_with_alignments(tf.constant(sentences))
    assert texts_of(graph["translations"]) == expected and texts_of(graph["alignments"]) == aligned
    source_ids = translator.source_ids(tf.constant(sentences[:-1]))
    eager = align_ids(translator.model, translator.tokenizer, source_ids, translator.search(source_ids)[0], -1)
    assert texts_of(eager) == aligned[:-1]
    loaded = tf.saved_model.load(export)
    assert set(loaded.signatures) == {"serving_default", "translate_with_prefix", "translate_with_alignments"}
    served = loaded.signatures["translate_with_alignments"](inputs=tf.constant(sentences))
    assert texts_of(served["translations"]) == expected and texts_of(served["alignments"]) == aligned
    np.testing.assert_allclose(served["scores"].numpy(), scores, atol=1e-5)
    default = loaded.signatures["serving_default"](inputs=tf.constant(sentences))  # as it was: no alignments
    assert set(default) == {"translations", "scores"} and texts_of(default["translations"]) == expected
    np.testing.assert_allclose(default["scores"].numpy(), scores, atol=1e-5)
    assert SavedModelTranslator(export).translate(sentences, alignments=True) == (expected, aligned)


def test_saved_models_refuse_other_layers_and_combinations(export_dir, tmp_path):
    from keras_transformer.inference.loading import load_translator
    from keras_transformer.inference.translator import SavedModelTranslator

    saved = SavedModelTranslator(export_dir)
    with pytest.raises(ParameterError, match="^target_prefixes cannot be given with alignments: .* no signature"):
        saved.translate(["abc"], alignments=True, target_prefixes=["ab"])
    with pytest.raises(ParameterError, match="^n_best cannot be given with alignments: .* no signature"):
        saved.aligned_strings(tf.constant(["abc"]), n_best=1)  # translate() finds no n-best signature first
    assert load_translator(export_dir, alignment_layer=-1).alignment_layer == -1
    with pytest.raises(ParameterError, match="^alignment_layer must be -1 for "):
        load_translator(export_dir, alignment_layer=0)
    tflite = tmp_path / "model.tflite"
    tflite.write_bytes(b"")
    with pytest.raises(ParameterError, match="^alignment_layer cannot be given: .* LiteRT file"):
        load_translator(str(tflite), alignment_layer=0)


# ----------------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------------


def run_translate(capsys, *args):
    capsys.readouterr()
    status = cli.main(["translate", *args])
    return status, capsys.readouterr().out.splitlines()


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


FLAGS = {
    "float32": ["--beam", "2", "--max-extra-length", "4"],
    "bfloat16": ["--beam", "2", "--max-extra-length", "4", "--precision", "bfloat16", "--alignment-layer", "0"],
}


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_command_line_prints_the_librarys_alignments(copy_task, request, precision, tmp_path, capsys):
    """`translate --alignments` of the run directory and of the export: `translation ||| alignment` per line."""
    translator, export = models(request, precision)
    sentences = mixed_sentences(copy_task[1])
    expected, aligned = translator.translate(sentences, alignments=True)
    source = write_lines(tmp_path / "src.txt", sentences)
    lines = [f"{text} ||| {alignment}" for text, alignment in zip(expected, aligned)]
    for model, flags in ((copy_task[0], FLAGS[precision]), (export, [])):
        status, printed = run_translate(
            capsys, "--model", model, *flags, "--alignments", "--input", source, "--no-progress"
        )
        assert (status, printed) == (0, lines), model
    if precision == "float32":
        lists = translator.translate(sentences[:2], n_best=2, alignments=True)
        status, printed = run_translate(
            capsys, "--model", copy_task[0], *FLAGS[precision], "--alignments", "--n-best", "2", *sentences[:2]
        )
        assert status == 0
        assert printed == [
            f"{i}\t{score:.6f}\t{t} ||| {a}" for i, entries in enumerate(lists) for t, score, a in entries
        ]


def test_command_line_refuses_bad_layers_and_combinations_in_one_line(copy_task, export_dir, tmp_path, capsys):
    run_dir = copy_task[0]

    def error(*args):
        with pytest.raises(SystemExit) as caught:
            run_translate(capsys, *args, "--no-progress", "abc de")
        err = capsys.readouterr().err.strip()
        assert caught.value.code == 2 and len(err.splitlines()) == 1, err
        return err

    assert "--alignment-layer 1: must be between -1 and 0" in error(
        "--model", run_dir, "--alignments", "--alignment-layer", "1"
    )
    assert "--alignment-layer 0: needs --alignments." in error("--model", run_dir, "--alignment-layer", "0")
    assert f"--alignments with --n-best 1: {export_dir} is a SavedModel" in error(
        "--model", export_dir, "--alignments", "--n-best", "1"
    )
    prefixes = write_lines(tmp_path / "prefixes.txt", ["ab"])
    assert f"--alignments with --target-prefix {prefixes}: " in error(
        "--model", export_dir, "--alignments", "--target-prefix", prefixes
    )
    assert "--alignment-layer 0: must be -1 for " in error(
        "--model", export_dir, "--alignments", "--alignment-layer", "0"
    )
    import argparse

    message = cli.parameter_error_message(
        "translate", argparse.Namespace(alignments=True), ParameterError("alignments", "cannot be given: a LiteRT")
    )
    assert message == "--alignments: cannot be given: a LiteRT"


def test_help_documents_the_flags_with_an_example(capsys):
    texts = {}
    for command in ("translate", "export"):
        with pytest.raises(SystemExit):
            cli.main([command, "--help"])
        texts[command] = " ".join(capsys.readouterr().out.split())
        assert "--alignment-layer N" in texts[command] and "-1, the last" in texts[command]
    assert "translate --alignments 'A dog runs.' prints 'Ein Hund rennt. ||| 0-0 1-1 2-2'" in texts["translate"]
