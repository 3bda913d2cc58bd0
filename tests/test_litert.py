"""The LiteRT translator (`inference.litert`): one `.tflite` file that answers as the `Translator` does.

- Its tokenizer, run by LiteRT, gives the `Translator`'s source ids on Multi30k and on awkward text (spaces
  of every kind, byte-order marks, "▁", invalid UTF-8, characters outside the vocabulary), and its
  detokenizer `Tokenizer.detokenize`'s texts (byte pieces, the unknown piece and U+0000 included).
- The exported file holds LiteRT builtins and tensorflow-text's two ops only, has the SavedModel's signature,
  and translates as the `Translator` (identical translations, scores within 1e-4), with LiteRT's reference
  kernels too, in threads, and in a fresh process where Keras cannot be imported.
- int8 dynamic-range quantization shrinks it; what it cannot hold is refused with the reason.
- The graph rewrite: slices that add axes to tensors of two dynamic dimensions, or that start with an
  ellipsis, become builtins of the oldest slice versions, with the same values.
"""

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest
from conftest import TINY_RUN_MAX_LENGTH

from keras_transformer.special_ids import EOS_ID

MAX_EXTRA = 6  # short outputs: the model is untrained
AWKWARD = [
    "A dog runs on the beach.",
    "",
    "  \t ",
    "\ufeffTwo men\u00a0are\u3000talking .",
    "  lead and trail \u2028",
    "a\nb",
    "▁",
    "x ▁",
    "中文 😀 \x00 ü",
    "Zwei Hunde spielen im Schnee.",
    "word " * 40,
    "é" * 700,
]
INVALID_UTF8 = [b"\xff\xfeab", b"caf\xc3", b"\xe2\x82 x", b"\xed\xa0\x80", b"ok \xf0\x9f\x98"]


def _random_texts(count, seed):
    rng = random.Random(seed)
    alphabet = list("aAbBeéEßünN.,-' \t\r\x0b\x0c\n") + ["\u00a0", "\u3000", "\ufeff", "\u2581", "\ufffd", "😀", "中"]
    alphabet += ["\x00", "\x85", "\u2028", "  "]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(count)]


def _random_bytes(count, seed):
    rng = random.Random(seed)
    alphabet = [0x41, 0x20, 0x80, 0xBF, 0xC3, 0xA9, 0xE2, 0x82, 0xAC, 0xED, 0xA0, 0xF0, 0x9F, 0x98, 0xFF, 0xEF, 0xBB]
    return [bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 10))) for _ in range(count)]


@pytest.fixture(scope="module")
def translator(tiny_run_dir):
    from keras_transformer.inference.export_sources import DecodingOptions, translator_of_run

    return translator_of_run(tiny_run_dir, DecodingOptions(max_extra_length=MAX_EXTRA), None, "float32")


@pytest.fixture(scope="module")
def litert_path(tmp_path_factory, translator):
    from keras_transformer.inference.litert import export_litert

    return export_litert(translator, tmp_path_factory.mktemp("litert") / "tiny.tflite")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED_VOCABULARY = os.path.join(ROOT, "saved_models", "multi30k_en_de", "1", "assets", "spm.model")


@pytest.fixture(scope="module", params=["tiny", "committed"])
def vocabulary(request, tmp_path_factory, tiny_run_dir):
    """`(tokenizer, max_input_length, runners)`: LiteRT runners of the text functions alone for a vocabulary,
    "ids" (sentences -> source ids) and "texts" (ids -> texts). The tiny run's 400 pieces, and the committed
    model's 9,713, which has the pieces of doubled letters that make BPE's order of equal pairs matter."""
    import tensorflow as tf

    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.inference import litert_graph, litert_text
    from keras_transformer.inference.litert import make_interpreter
    from keras_transformer.inference.litert_vocab import SubwordTables

    if request.param == "tiny":
        tokenizer, max_input_length = Tokenizer(os.path.join(tiny_run_dir, "spm.model")), TINY_RUN_MAX_LENGTH
    else:
        if not os.path.exists(COMMITTED_VOCABULARY):
            pytest.skip("no committed model")
        tokenizer, max_input_length = Tokenizer(COMMITTED_VOCABULARY), 256
    tables = SubwordTables.from_proto(tokenizer.model_proto)
    ids = tf.function(
        lambda inputs: {"ids": litert_text.source_ids(inputs, tables, max_input_length)[0]},
        input_signature=[tf.TensorSpec([None], tf.string, name="inputs")],
        autograph=False,
    )
    texts = tf.function(
        lambda token_ids: {"texts": litert_text.detokenize(token_ids, tables, 24)},
        input_signature=[tf.TensorSpec([None, None], tf.int32, name="token_ids")],
        autograph=False,
    )
    functions = {"ids": ids.get_concrete_function(), "texts": texts.get_concrete_function()}
    path = tmp_path_factory.mktemp("litert_text") / "text.tflite"
    path.write_bytes(litert_graph.convert(functions))
    interpreter = make_interpreter(str(path))
    return tokenizer, max_input_length, {name: interpreter.get_signature_runner(name) for name in functions}


def _reference_ids(tokenizer, max_input_length, sentences):
    """`Translator.source_ids` (normalized, tokenized, cut, end token), rows without padding."""
    import tensorflow as tf

    from keras_transformer.inference.translator import Translator

    pieces = tokenizer.tokenize(Translator.normalized(tf.constant(sentences, tf.string)))[:, : max_input_length - 1]
    return [row + [EOS_ID] for row in pieces.to_list()]


def _litert_ids(runner, sentences):
    ids = runner(inputs=np.array([s.encode("utf-8") if isinstance(s, str) else s for s in sentences], dtype=object))
    return [[int(i) for i in row if i] for row in ids["ids"][: len(sentences)]]


# The text functions --------------------------------------------------------------------------


def test_tokenizer_gives_the_translators_source_ids_on_multi30k(vocabulary):
    from keras_transformer.data.corpora import read_lines

    tokenizer, max_input_length, runners = vocabulary
    sentences = [line for split in ("val", "test2016") for lang in ("en", "de") for line in read_lines(split, lang)]
    sentences += read_lines("train", "en")[:2000] + read_lines("train", "de")[:2000]
    for start in range(0, len(sentences), 500):
        chunk = sentences[start : start + 500]
        assert _litert_ids(runners["ids"], chunk) == _reference_ids(tokenizer, max_input_length, chunk)


def test_tokenizer_gives_the_translators_source_ids_on_awkward_text(vocabulary):
    tokenizer, max_input_length, runners = vocabulary
    letters = "abcdefghijklmnopqrstuvwxyzäöüß.-!"
    # Equal pairs side by side ("eee", "ababa"): BPE merges the leftmost first.
    texts = (
        AWKWARD + [c * n for c in letters for n in range(3, 8)] + [a + b + a + b + a for a in letters for b in letters]
    )
    texts += _random_texts(2000, seed=0)
    assert _litert_ids(runners["ids"], texts) == _reference_ids(tokenizer, max_input_length, texts)
    raw = INVALID_UTF8 + _random_bytes(2000, seed=1)
    assert _litert_ids(runners["ids"], raw) == _reference_ids(tokenizer, max_input_length, raw)
    assert _litert_ids(runners["ids"], []) == []


def test_detokenizer_writes_what_sentencepiece_writes(vocabulary):
    import tensorflow as tf

    from keras_transformer.inference.litert_vocab import SubwordTables

    tokenizer, _, runners = vocabulary
    tables = SubwordTables.from_proto(tokenizer.model_proto)
    rng = random.Random(2)
    special = [0, 1, 2, 3, tables.space_id, *tables.byte_ids.tolist()]  # pad, unk, bos, eos, "▁", bytes
    rows = [
        [
            rng.choice(special) if rng.random() < 0.5 else rng.randrange(tables.vocab_size)
            for _ in range(rng.randint(0, 20))
        ]
        for _ in range(3000)
    ]
    ids = np.array([row + [0] * (20 - len(row)) for row in rows], np.int32)
    expected = [tokenizer.detokenize(tf.constant(ids[i : i + 500])).numpy() for i in range(0, len(ids), 500)]
    assert runners["texts"](token_ids=ids)["texts"].tolist() == np.concatenate(expected).tolist()


def test_bounded_characters_cut_as_the_translator_does():
    import tensorflow as tf

    from keras_transformer.inference import litert_text

    texts = ["é" * 6, "abcdefgh", "abcd\ufffd\ufffdxyz", "abcdef\ufffd", "", "日本語です"]
    encoded = [text.encode("utf-8") for text in texts] + INVALID_UTF8 + [b"abcdef\xff\xff", b"abc\xff\xffdef"]
    limit = 7
    got = litert_text.bounded_characters(litert_text.byte_grid(tf.constant(encoded)), limit).numpy()
    for row, data in zip(got, encoded):
        text = data[:limit].decode("utf-8", "replace")
        if len(data) > limit:
            text = text.rstrip("\ufffd")  # Translator.bounded: a cut sentence loses its trailing U+FFFDs
        assert [chr(c) for c in row if c >= 0] == list(text), data


# The exported file --------------------------------------------------------------------------


def test_file_holds_builtins_and_tensorflow_texts_ops_with_the_saved_models_signature(litert_path):
    from keras_transformer.inference.litert import info_path, make_interpreter

    info = json.loads(open(info_path(litert_path), encoding="utf-8").read())
    custom = sorted(name for name in info["operators"] if name.startswith("CUSTOM:"))
    assert custom == ["CUSTOM:TFText>ByteSplitWithOffsets", "CUSTOM:TFText>NgramsStringJoin"]
    assert info["operators"]["WHILE"] >= 2  # the BPE merges and the search
    assert info["decoding"]["max_extra_length"] == MAX_EXTRA and info["precision"] == "float32"
    assert info["size_bytes"] == os.path.getsize(litert_path) and info["quantization"] is None
    signatures = make_interpreter(litert_path).get_signature_list()
    assert signatures["serving_default"] == {"inputs": ["inputs"], "outputs": ["scores", "translations"]}
    assert signatures["source_pieces"] == {"inputs": ["inputs"], "outputs": ["pieces"]}


def _assert_same_answers(expected, got):
    assert got["translations"].numpy().tolist() == expected["translations"].numpy().tolist()
    np.testing.assert_allclose(got["scores"].numpy(), expected["scores"].numpy(), atol=1e-4)


def test_file_translates_as_the_translator(translator, litert_path):
    import tensorflow as tf

    from keras_transformer.inference.litert import LiteRTTranslator

    inputs = [s.encode("utf-8") for s in AWKWARD] + INVALID_UTF8
    expected = translator.translate_strings(tf.constant(inputs))
    litert = LiteRTTranslator(litert_path)
    _assert_same_answers(expected, litert.translate_strings(inputs))
    _assert_same_answers(expected, LiteRTTranslator(litert_path, reference_kernels=True).translate_strings(inputs))
    assert litert.translate_strings(inputs)["translations"].numpy()[1:3].tolist() == [b"", b""]  # blank inputs
    empty = litert.translate_strings([])
    assert empty["translations"].shape == (0,) and empty["scores"].shape == (0,)
    assert litert.source_pieces(AWKWARD).tolist() == translator.source_pieces(AWKWARD).tolist()


@pytest.mark.parametrize("reference_kernels", [False, True])
def test_ai_edge_litert_runs_the_file_as_tensorflows_interpreter(translator, litert_path, reference_kernels):
    """The `ai-edge-litert` package's interpreter (LiteRT outside TensorFlow), with XNNPACK and with the
    reference kernels, gives the translator's answers."""
    import tensorflow as tf

    pytest.importorskip("ai_edge_litert")
    from keras_transformer.inference.litert import LiteRTTranslator

    inputs = [s.encode("utf-8") for s in AWKWARD] + INVALID_UTF8
    litert = LiteRTTranslator(litert_path, runtime="ai_edge_litert", reference_kernels=reference_kernels)
    _assert_same_answers(translator.translate_strings(tf.constant(inputs)), litert.translate_strings(inputs))


def test_translate_batches_in_threads_as_translate_strings(litert_path):
    from keras_transformer.inference.litert import LiteRTTranslator

    litert = LiteRTTranslator(litert_path)
    sentences = AWKWARD * 3
    expected = [t.decode("utf-8") for t in litert.translate_strings(sentences)["translations"].numpy()]
    assert litert.translate(sentences, batch_size=4, workers=2) == expected


def test_file_runs_without_keras_or_the_models_code(tmp_path, litert_path):
    from keras_transformer.inference.litert import LiteRTTranslator

    hidden = tmp_path / "no_keras" / "keras"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text('raise ImportError("Keras is hidden from this process")\n')
    script = tmp_path / "client.py"
    script.write_text(
        "import json, sys\n"
        "from keras_transformer.inference.litert import LiteRTTranslator\n"
        f"out = LiteRTTranslator({str(litert_path)!r}).translate_strings({AWKWARD!r})\n"
        # tensorflow-text's package would import Keras; its LiteRT kernels' extension module is loaded alone.
        "loaded = [m for m in sys.modules if m in ('keras', 'tensorflow_text') or m.startswith(('keras.',"
        " 'keras_transformer.model', 'keras_transformer.layers', 'keras_transformer.decoding.search'))]\n"
        "print(json.dumps({'translations': [t.hex() for t in out['translations'].numpy()], 'loaded': loaded}))\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hidden.parent), ROOT]), TF_CPP_MIN_LOG_LEVEL="3")
    completed = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-2000:]
    answer = json.loads(completed.stdout.strip().splitlines()[-1])
    assert answer["loaded"] == []
    expected = LiteRTTranslator(litert_path).translate_strings(AWKWARD)["translations"].numpy()
    assert [bytes.fromhex(t) for t in answer["translations"]] == expected.tolist()


def test_int8_quantization_shrinks_the_file(tmp_path, tiny_run_dir, litert_path):
    from keras_transformer.inference.export_sources import DecodingOptions
    from keras_transformer.inference.litert import LiteRTTranslator, export_litert, info_path

    path = export_litert(
        tiny_run_dir, tmp_path / "int8.tflite", DecodingOptions(max_extra_length=MAX_EXTRA), quantize="int8"
    )
    assert os.path.getsize(path) < 0.6 * os.path.getsize(litert_path)
    info = json.loads(open(info_path(path), encoding="utf-8").read())
    assert info["quantization"].startswith("int8 dynamic range") and info["source"] == tiny_run_dir
    answers = LiteRTTranslator(path).translate_strings(AWKWARD)
    assert answers["translations"].shape == (len(AWKWARD),) and answers["translations"].numpy()[1] == b""


def test_request_limit_and_n_best(litert_path):
    from keras_transformer.errors import ParameterError
    from keras_transformer.inference.litert import LiteRTTranslator, load_litert_translator

    litert = LiteRTTranslator(litert_path)
    assert litert.max_batch_size == 1024 and litert.max_input_length == TINY_RUN_MAX_LENGTH
    with pytest.raises(ValueError, match="at most 1024 sentences per request"):
        litert.translate_strings([""] * 1025)
    with pytest.raises(ParameterError, match="n_best"):
        litert.translate(["A dog."], n_best=2)
    with pytest.raises(ValueError, match="sampling"):
        load_litert_translator(litert_path, sampling={"top_k": 5})
    assert isinstance(load_litert_translator(litert_path, options_given=True), LiteRTTranslator)


def test_load_translator_takes_a_litert_file(litert_path, caplog):
    from keras_transformer.inference import load_translator
    from keras_transformer.inference.litert import LiteRTTranslator

    assert isinstance(load_translator(str(litert_path)), LiteRTTranslator)
    assert not caplog.records
    assert isinstance(load_translator(str(litert_path), beam_size=2), LiteRTTranslator)
    assert "decoding options were fixed at export" in caplog.text
    with pytest.raises(ValueError, match="sampling"):
        load_translator(str(litert_path), sampling={"top_k": 5})


def test_what_the_file_cannot_hold_is_refused(tmp_path, translator, litert_path):
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.data.tokenizer import train_tokenizer
    from keras_transformer.errors import ParameterError
    from keras_transformer.inference.litert import export_litert
    from keras_transformer.inference.litert_vocab import SubwordTables
    from keras_transformer.inference.translator import Translator

    unigram = train_tokenizer(read_lines("train", "en")[:500], tmp_path / "uni", vocab_size=600, model_type="unigram")
    with pytest.raises(ValueError, match="model_type UNIGRAM, not BPE"):
        SubwordTables.from_proto(unigram.model_proto)
    sampler = Translator(translator.model, translator.tokenizer, max_extra_length=MAX_EXTRA, sampling={"top_k": 3})
    with pytest.raises(ValueError, match="sampling has no LiteRT form"):
        export_litert(sampler, tmp_path / "s.tflite")
    with pytest.raises(ParameterError, match="quantize"):
        export_litert(translator, tmp_path / "q.tflite", quantize="int4")
    with pytest.raises(ParameterError, match="precision.*float32"):
        export_litert(translator, tmp_path / "p.tflite", precision="bfloat16")
    with pytest.raises(ParameterError, match="output_path"):
        export_litert(translator, tmp_path / "model.bin")
    with pytest.raises(FileExistsError, match="overwrite"):
        export_litert(translator, litert_path)


# The graph rewrite --------------------------------------------------------------------------


def _slices(x):
    import tensorflow as tf

    return {"added": x[:, None, :] * 2 + tf.cast(x[:, :, None][:, :1, :1], x.dtype), "tail": x[..., :2] + 1}


def test_rewritten_slices_are_old_builtins_with_the_same_values(tmp_path):
    import tensorflow as tf

    from keras_transformer.inference import litert_graph
    from keras_transformer.inference.litert import make_interpreter

    function = tf.function(_slices, input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
    path = tmp_path / "slices.tflite"
    path.write_bytes(litert_graph.convert({"serving_default": function.get_concrete_function()}))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    # The reference kernels have the slice up to its version 4: no ellipsis, no new axis is left.
    got = make_interpreter(str(path), reference_kernels=True).get_signature_runner()(x=x)
    for name, value in _slices(tf.constant(x)).items():
        np.testing.assert_array_equal(got[name], value.numpy())


def test_without_the_rewrite_the_converter_keeps_tensorflow_slices(monkeypatch):
    import tensorflow as tf

    from keras_transformer.inference import litert_graph

    monkeypatch.setattr(litert_graph, "expand_new_axes", lambda graph_def: 0)
    function = tf.function(_slices, input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
    with pytest.raises(ValueError, match="TensorFlow ops CUSTOM:StridedSlice"):
        litert_graph.convert({"serving_default": function.get_concrete_function()})


def test_the_command_line_exports_and_translates_a_litert_file(tmp_path, tiny_run_dir, litert_path, capsys):
    """`export --format litert` writes the file `export_litert` writes for the same options, and `translate
    --model FILE.tflite` prints its translations; the flags a LiteRT file cannot hold are refused by name."""
    from keras_transformer import cli
    from keras_transformer.inference.litert import LiteRTTranslator, info_path

    path = str(tmp_path / "cli.tflite")
    argv = ["export", "--model", tiny_run_dir, "--format", "litert", "--max-extra-length", str(MAX_EXTRA)]
    assert cli.main(argv + ["--output", path]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == path and "precision: float32 (LiteRT)" in captured.err
    recorded = json.loads(open(info_path(path), encoding="utf-8").read())["decoding"]
    assert recorded == json.loads(open(info_path(litert_path), encoding="utf-8").read())["decoding"]
    sentences = ["A dog runs on the beach.", "Two men are playing soccer."]
    assert cli.main(["translate", "--model", path] + sentences) == 0
    assert capsys.readouterr().out.splitlines() == LiteRTTranslator(litert_path).translate(sentences)
    for flags, refused in (
        (["--format", "litert", "--n-best", "2"], "--n-best 2: not for --format litert"),
        (["--format", "litert", "--precision", "bfloat16"], "--precision bfloat16: not for --format litert"),
        (["--quantize", "int8"], "--quantize int8: needs --format litert."),
    ):
        with pytest.raises(SystemExit) as raised:
            cli.main(["export", "--model", tiny_run_dir, "--output", str(tmp_path / "x.tflite")] + flags)
        assert raised.value.code == 2
        assert refused in capsys.readouterr().err
