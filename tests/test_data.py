"""Tests for keras_transformer.data (corpora, text, spec, batching) (input pipeline).

Runs on the vendored data only (no network, no /work/shared). Kept fast: the
tokenizer is trained once per module on a few thousand lines, and batching
tests use the small Multi30k splits or a slice of train.
"""

import collections
import gzip
import json
import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import data
from keras_transformer.data import corpora
from keras_transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, train_tokenizer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT_SPEC = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """A small joint BPE vocabulary (1000) trained on 3000 + 3000 train lines."""
    texts = corpora.read_lines("train", "en")[:3000] + corpora.read_lines("train", "de")[:3000]
    return train_tokenizer(texts, tmp_path_factory.mktemp("spm") / "spm", vocab_size=1000)


def _pairs(dataset):
    return [(s.decode(), t.decode()) for s, t in dataset.as_numpy_iterator()]


def _write(path, lines_or_bytes):
    data_bytes = lines_or_bytes if isinstance(lines_or_bytes, bytes) else "".join(lines_or_bytes).encode()
    path.write_bytes(data_bytes)
    return str(path)


# ---------------------------------------------------------------------------
# Vendored data sets
# ---------------------------------------------------------------------------
MULTI30K_EXPECTED = {
    # split: (count, first (en, de), last (en, de))
    "train": (
        29000,
        (
            "Two young, White males are outside near many bushes.",
            "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        ),
        (
            "A man in shorts and a Hawaiian shirt leans over the rail of a pilot boat, with fog and "
            "mountains in the background.",
            "Ein Mann in Shorts und Hawaiihemd lehnt sich über das Geländer eines Lotsenboots, mit "
            "Nebel und Bergen im Hintergrund.",
        ),
    ),
    "val": (
        1014,
        (
            "A group of men are loading cotton onto a truck",
            "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen",
        ),
        (
            "Two women wearing red and a man coming out of a port-a-potty.",
            "Zwei Frauen in Rot und ein Mann, der aus einer transportablen Toilette kommt.",
        ),
    ),
    "test2016": (
        1000,
        ("A man in an orange hat starring at something.", "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt."),
        (
            "A girl at the shore of a beach with a mountain in the distance.",
            "Ein Mädchen an einer Küste mit einem Berg im Hintergrund.",
        ),
    ),
}


@pytest.mark.parametrize("split", sorted(MULTI30K_EXPECTED))
def test_multi30k_counts_and_alignment(split):
    count, first, last = MULTI30K_EXPECTED[split]
    en, de = corpora.read_lines(split, "en"), corpora.read_lines(split, "de")
    assert len(en) == len(de) == count
    assert (en[0], de[0]) == first
    assert (en[-1], de[-1]) == last

    ds = corpora.load_multi30k(split, src="en", tgt="de")
    assert ds.element_spec == TEXT_SPEC
    assert int(ds.cardinality()) == count
    assert _pairs(ds.take(1)) == [first]
    assert _pairs(ds.skip(count - 1)) == [last]
    # Other direction swaps the sides.
    assert _pairs(corpora.load_multi30k(split, src="de", tgt="en").take(1)) == [first[::-1]]


def test_multi30k_quirks_are_normalized():
    de = corpora.read_lines("train", "de")
    # Line 7366 has a TAB inside the sentence; it becomes a single space.
    assert de[7365] == '"Zwei männliche und eine weibliche Person spielen in einer Wasserfontäne."'
    # 40 lines had leading/trailing spaces; all are stripped, none is empty.
    assert all(line == line.strip() and line for line in de)
    assert not any("\t" in line or "  " in line for line in de)


def test_multi30k_files_are_gzip_in_package():
    path = corpora.multi30k_path("val", "en")
    assert path.endswith(os.path.join("data", "multi30k", "val.en.gz")) and os.path.exists(path)
    with gzip.open(path, "rt", encoding="utf-8") as f:
        assert f.readline() == "A group of men are loading cotton onto a truck\n"
    for name in ("multi30k", "newstest2014"):
        readme = os.path.join(os.path.dirname(corpora.__file__), name, "README.md")
        assert os.path.exists(readme)
    readme = open(os.path.join(os.path.dirname(path), "README.md"), encoding="utf-8").read()
    assert "non-commercial" in readme and "Elliott" in readme


@pytest.mark.parametrize(
    "call, valid",
    [
        (lambda: corpora.multi30k_path("test", "en"), "train, val, test2016"),
        (lambda: corpora.load_multi30k("dev"), "train, val, test2016"),
        (lambda: corpora.read_lines("val", "fr"), "en, de"),
        (lambda: corpora.load_multi30k("train", src="fr"), "en, de"),
        (lambda: corpora.newstest2014_path("cs"), "en, de"),
    ],
)
def test_vendored_bad_split_or_language(call, valid):
    with pytest.raises(ValueError, match=valid):
        call()


def test_newstest2014():
    en, de = corpora.read_newstest2014("en"), corpora.read_newstest2014("de")
    assert len(en) == len(de) == 3003
    assert (en[0], de[0]) == ("Gutach: Increased safety for pedestrians", "Gutach: Noch mehr Sicherheit für Fußgänger")
    assert en[-1].startswith("However, following the recent murder of Australian travel agent")
    assert de[-1].endswith("und es deshalb zu einem Freispruch kommt.")
    assert corpora.newstest2014_path("de").endswith("newstest2014.de.gz")
    assert int(corpora.load_newstest2014().cardinality()) == 3003


# ---------------------------------------------------------------------------
# load_parallel_text: validation of user files
# ---------------------------------------------------------------------------
def test_parallel_text_mismatched_counts(tmp_path):
    src = _write(tmp_path / "a.en", ["one\n", "two\n", "three\n"])
    tgt = _write(tmp_path / "a.de", ["eins\n", "zwei\n"])
    with pytest.raises(ValueError) as err:
        data.load_parallel_text(src, tgt)
    message = str(err.value)
    assert src in message and tgt in message and "3" in message and "2" in message


def test_parallel_text_invalid_utf8_names_file_and_line(tmp_path):
    src = _write(tmp_path / "a.en", ["one\n", "two\n", "three\n"])
    tgt = _write(tmp_path / "a.de", b"eins\nzwei\ndr\xe4i\n")  # Latin-1 'ä' on line 3
    with pytest.raises(ValueError, match=r"a\.de: line 3: invalid UTF-8"):
        data.load_parallel_text(src, tgt)


def test_parallel_text_blank_lines_skipped_and_counted(tmp_path, caplog):
    src = _write(tmp_path / "a.en", ["one\n", "\n", "three\n", "four\n", "five\n"])
    tgt = _write(tmp_path / "a.de", ["eins\n", "zwei\n", "  \t \n", "vier\n", "fünf\n"])
    with caplog.at_level(logging.WARNING, logger="keras_transformer.data"):
        ds, stats = data.load_parallel_text(src, tgt, return_stats=True)
    assert _pairs(ds) == [("one", "eins"), ("four", "vier"), ("five", "fünf")]
    assert stats.num_lines == 5 and stats.num_pairs == 3 and stats.num_skipped == 2
    assert stats.skipped_line_numbers == (2, 3)
    assert "Skipped 2 of 5 pairs" in caplog.text
    # Without return_stats it is just the dataset.
    assert isinstance(data.load_parallel_text(src, tgt), tf.data.Dataset)


def test_parallel_text_whitespace_tabs_crlf_bom_and_gzip(tmp_path):
    src = _write(tmp_path / "a.en", "\ufeff  A  dog\truns. \r\nOne\u2028line\n".encode())
    tgt_path = tmp_path / "a.de.gz"
    tgt_path.write_bytes(gzip.compress(b"Ein Hund\t\trennt.\t\nEine Zeile\n"))
    ds, stats = data.load_parallel_text(src, tgt_path, return_stats=True)
    # U+2028 is not a line break for parallel text: both files have 2 lines.
    assert _pairs(ds) == [("A dog runs.", "Ein Hund rennt."), ("One\u2028line", "Eine Zeile")]
    assert ds.element_spec == TEXT_SPEC and stats.num_skipped == 0


def test_parallel_text_without_a_final_newline(tmp_path):
    src = _write(tmp_path / "a.en", ["a\n", "b"])
    tgt = _write(tmp_path / "a.de", ["x\n", "y"])
    assert _pairs(data.load_parallel_text(src, tgt)) == [("a", "x"), ("b", "y")]


@pytest.mark.parametrize("content", [b"", b"\n \t\n"], ids=["empty", "blank"])
def test_parallel_text_without_a_pair_is_refused_by_name(tmp_path, content):
    """No pair to train or score on is an error that names both files, not an empty dataset."""
    src, tgt = _write(tmp_path / "e.en", content), _write(tmp_path / "e.de", content)
    with pytest.raises(ValueError, match=r"e\.en / .*e\.de: no pair has text on both sides"):
        data.load_parallel_text(src, tgt)


def test_parallel_text_names_the_file_it_cannot_read(tmp_path):
    good = _write(tmp_path / "good.de", ["eins\n"])
    (tmp_path / "dir.en").mkdir()
    (tmp_path / "cut.en.gz").write_bytes(gzip.compress(b"one\n")[:-6])  # the stream ends early
    (tmp_path / "bad.en.gz").write_bytes(b"\x1f\x8b" + b"not gzip")
    for name, problem in (
        ("missing.en", r"missing\.en: no such file"),
        ("dir.en", r"dir\.en cannot be read \(a directory, not a file\)"),
        ("cut.en.gz", r"cut\.en\.gz: broken gzip data"),
        ("bad.en.gz", r"bad\.en\.gz: broken gzip data"),
    ):
        with pytest.raises(ValueError, match=problem):
            data.load_parallel_text(tmp_path / name, good)


# ---------------------------------------------------------------------------
# load_dataset / load_tfds
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("gzipped", [False, True])
def test_check_text_file_counts_lines_as_read_text_lines_and_hashes_the_bytes(tmp_path, gzipped):
    import hashlib

    text = "\ufeffZwei M\u00e4nner.\r\n\nA dog\u2028with a separator\nno final newline".encode()
    path = tmp_path / "a.de"
    path.write_bytes(gzip.compress(text) if gzipped else text)
    described = data.check_text_file(path)
    assert described["lines"] == len(data.read_text_lines(path)) == 4
    assert described["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert described["path"] == str(path)


def test_check_text_file_names_what_it_cannot_read(tmp_path):
    (tmp_path / "empty.en").write_bytes(b"")
    (tmp_path / "bom.en").write_bytes("\ufeff".encode())  # read_text_lines reads no line from it
    (tmp_path / "bad.en").write_bytes(b"fine\n" * 300_000 + b"caf\xe9\nmore\n")  # past the first block
    (tmp_path / "cut.en").write_bytes("ok\nMänner".encode()[:-5])  # ends inside a character
    (tmp_path / "dir.en").mkdir()
    for name, problem in (
        ("missing.en", "missing.en: no such file"),
        ("dir.en", "dir.en is a directory, not a file"),
        ("empty.en", "empty.en is empty"),
        ("bom.en", "bom.en is empty"),
        ("bad.en", "bad.en: line 300001: invalid UTF-8"),
        ("cut.en", "cut.en: line 2: invalid UTF-8"),
    ):
        with pytest.raises(ValueError, match=problem):
            data.check_text_file(tmp_path / name)


def test_load_dataset_specs(tmp_path):
    first_val = MULTI30K_EXPECTED["val"][1]
    assert _pairs(data.load_dataset("multi30k", "val", "en", "de").take(1)) == [first_val]
    # "validation"/"test" are accepted for Multi30k so one CLI split name fits all.
    assert int(data.load_dataset("multi30k", "validation").cardinality()) == 1014
    assert int(data.load_dataset("multi30k", "test").cardinality()) == 1000

    for split in ("train", "dev"):
        _write(tmp_path / f"{split}.en", [f"{split} one\n", f"{split} two\n"])
        _write(tmp_path / f"{split}.de", [f"{split} eins\n", f"{split} zwei\n"])
    spec = f"files:{tmp_path}/{{split}}.{{src}},{tmp_path}/{{split}}.{{tgt}}"
    assert _pairs(data.load_dataset(spec, "dev", "en", "de")) == [("dev one", "dev eins"), ("dev two", "dev zwei")]
    assert _pairs(data.load_dataset(spec, "train", "de", "en"))[0] == ("train eins", "train one")
    plain = f"files:{tmp_path}/train.en,{tmp_path}/train.de"
    assert data.load_dataset(plain, "ignored").element_spec == TEXT_SPEC

    for bad in ("wmt", "tfds:", "files:only_one_path"):
        with pytest.raises(ValueError, match="multi30k"):
            data.load_dataset(bad, "train")
    with pytest.raises(ValueError, match="valid values"):
        data.load_dataset("multi30k", "nosuchsplit")
    # Spaces around a path are not part of it; a doubled brace is a literal one.
    assert data.DataSpec.parse(f"files:{tmp_path}/train.en , {tmp_path}/train.de ").paths == (
        f"{tmp_path}/train.en",
        f"{tmp_path}/train.de",
    )
    assert data.DataSpec.parse("files:x{{y}}/{split}.{src},b.{tgt}").file_paths("dev") == ("x{y}/dev.en", "b.de")


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("files:data/{lang}.en,data/{lang}.de", r"path 'data/\{lang\}\.en' has \{lang\}; a path may contain"),
        ("files:data/{split.en,b.de", r"path 'data/\{split\.en': expected '\}'"),
        ("files:a.en,b/{}.de", r"path 'b/\{\}\.de' has \{\}"),
    ],
)
def test_files_spec_refuses_an_unknown_template_field_by_name(spec, problem):
    """Refused when parsed, naming the spec and the path, not a KeyError when the files are opened."""
    with pytest.raises(ValueError, match=f"^files: {problem}"):
        data.DataSpec.parse(spec)


def test_load_tfds_with_mock_data():
    """Each pair is (the `src` feature, the `tgt` feature) of one example, whitespace-normalized;
    asking for the other direction swaps the sides."""
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        raw = list(tfds.load("wmt14_translate/de-en", split="train", shuffle_files=False).as_numpy_iterator())
        en_de = data.load_tfds("wmt14_translate/de-en", split="train", src="en", tgt="de")
        de_en = data.load_tfds("wmt14_translate/de-en", split="train", src="de", tgt="en")
        assert en_de.element_spec == TEXT_SPEC == corpora.load_multi30k("val").element_spec
        pairs, swapped = list(en_de.as_numpy_iterator()), list(de_en.as_numpy_iterator())
        with pytest.raises(ValueError, match="valid: \\['de', 'en'\\]"):
            data.load_tfds("wmt14_translate/de-en", src="fr")

    def normalized(text):
        return data.normalize_line(text.decode("utf-8")).encode("utf-8")

    expected = [(normalized(r["en"]), normalized(r["de"])) for r in raw]
    expected = [(s, t) for s, t in expected if s and t]
    assert len(raw) == 6 and pairs == expected
    assert swapped == [(t, s) for s, t in expected]
    # The mock texts have runs of spaces: the pipeline must have normalized something.
    assert any(b"  " in r["en"] + r["de"] for r in raw)


def test_load_tfds_reads_the_files_in_an_order_of_its_shuffle_seed(monkeypatch):
    """A training stream resumed with another seed begins elsewhere in the split: tfds shuffles its files."""
    tfds = pytest.importorskip("tensorflow_datasets")
    calls = []
    with tfds.testing.mock_data(num_examples=6):
        as_dataset = tfds.core.DatasetBuilder.as_dataset

        def recording(builder, *args, **kwargs):
            calls.append(kwargs)
            return as_dataset(builder, *args, **kwargs)

        monkeypatch.setattr(tfds.core.DatasetBuilder, "as_dataset", recording)
        in_order = list(data.load_tfds("wmt14_translate/de-en").as_numpy_iterator())
        seeded = list(data.DataSpec.parse("tfds:wmt14_translate/de-en").load(shuffle_seed=7).as_numpy_iterator())
    assert calls[0]["shuffle_files"] is False
    assert calls[1]["shuffle_files"] is True and calls[1]["read_config"].shuffle_seed == 7
    assert sorted(seeded) == sorted(in_order)


def test_normalize_in_graph_normalizes_as_normalize_line():
    """tfds text (in the graph) and text files (in Python) give the same pairs: a line of only
    U+00A0 or U+3000 is empty (and skipped) either way. Python's str.strip() strips every
    character of str.isspace(): the Unicode space separators and more."""
    import sys

    from keras_transformer.data.text import normalize_in_graph

    whitespace = [chr(c) for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    assert "\u00a0" in whitespace and "\u3000" in whitespace and "\x85" in whitespace
    not_whitespace = ["\u200b", "\ufeff", "\u180e", "\x00", "\x1b", "x", "é"]
    lines = []
    for c in whitespace + not_whitespace:
        lines += [c, c * 3, f"{c}a b{c}", f"a{c}b", f"{c} \t a\t\tb {c}{c}", f" {c}Ein Hund{c} "]
    in_graph = [s.decode("utf-8") for s in normalize_in_graph(tf.constant(lines)).numpy()]
    assert in_graph == [data.normalize_line(line) for line in lines]
    assert data.normalize_line("\u00a0\u3000") == "" == in_graph[lines.index("\u00a0" * 3)]


# ---------------------------------------------------------------------------
# make_batches
# ---------------------------------------------------------------------------
def _strip(row):
    row = list(row)
    while row and row[-1] == PAD_ID:
        row.pop()
    return tuple(row)


def _expected_examples(pairs, tokenizer, max_length=None, truncate=False):
    """(source_ids, target_input_ids) each pair should produce, computed in Python."""
    expected = []
    for source, target in pairs:
        x, y = tokenizer.encode(source), tokenizer.encode(target)
        if truncate:
            x, y = x[: max_length - 1], y[: max_length - 1]
        if max_length is not None and max(len(x), len(y)) + 1 > max_length:
            continue
        expected.append((tuple(x + [EOS_ID]), tuple([BOS_ID] + y)))
    return expected


def _collect(batches, boundaries, batch_tokens, num_replicas=1):
    """Checks every batch's invariants and returns its examples (pads stripped). A batch may end in fewer than
    `num_replicas` empty rows (padding only), which fill it up to a multiple of `num_replicas`."""
    examples = []
    for (src, tgt_in), tgt_out in batches.as_numpy_iterator():
        assert src.dtype == tgt_in.dtype == tgt_out.dtype == np.int32
        assert src.shape == tgt_in.shape == tgt_out.shape
        batch, length = src.shape
        assert length in boundaries
        assert batch * length <= batch_tokens
        assert batch > 0 and batch % num_replicas == 0
        empty = ~(src.any(axis=1) | tgt_in.any(axis=1) | tgt_out.any(axis=1))
        real = batch - int(empty.sum())
        assert not empty[:real].any() and batch - real < num_replicas and real > 0
        src, tgt_in, tgt_out = src[:real], tgt_in[:real], tgt_out[:real]
        for s, ti, to in zip(src, tgt_in, tgt_out):
            s, ti, to = _strip(s), _strip(ti), _strip(to)
            # Padded to the *smallest* boundary that fits the pair.
            longest = max(len(s), len(ti))
            assert length == min(b for b in boundaries if b >= longest)
            assert s[-1] == EOS_ID and EOS_ID not in s[:-1] and BOS_ID not in s
            assert ti[0] == BOS_ID and to[-1] == EOS_ID and ti[1:] == to[:-1]
            assert PAD_ID not in s + ti + to
            examples.append((s, ti))
    return examples


@pytest.mark.parametrize("pool_size", [None, 300])  # one pool / several pools per epoch
def test_make_batches_epoch_is_complete_and_within_budget(tokenizer, pool_size):
    pairs = list(zip(corpora.read_lines("val", "en"), corpora.read_lines("val", "de")))
    boundaries = data.default_bucket_boundaries(128)
    batches = data.make_batches(
        corpora.load_multi30k("val"), tokenizer, batch_tokens=1280, max_length=128, num_replicas=1, pool_size=pool_size
    )
    assert batches.element_spec == (
        (tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, None], tf.int32)),
        tf.TensorSpec([None, None], tf.int32),
    )
    out = _collect(batches, boundaries, batch_tokens=1280)
    expected = _expected_examples(pairs, tokenizer, max_length=128)
    assert len(expected) == len(pairs)  # nothing is too long for 128 here
    # Same multiset: nothing lost, nothing duplicated.
    assert collections.Counter(out) == collections.Counter(expected)


def test_make_batches_drops_or_truncates_long_pairs(tokenizer):
    pairs = list(zip(corpora.read_lines("val", "en"), corpora.read_lines("val", "de")))[:300]
    ds = tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*pairs))))
    max_length, boundaries = 16, [8, 16]

    dropped = data.make_batches(
        ds, tokenizer, batch_tokens=256, max_length=max_length, bucket_boundaries=boundaries, num_replicas=1
    )
    kept = _collect(dropped, boundaries, 256)
    expected = _expected_examples(pairs, tokenizer, max_length=max_length)
    assert 0 < len(expected) < len(pairs)  # some are too long: the test means something
    assert collections.Counter(kept) == collections.Counter(expected)

    truncated = data.make_batches(
        ds,
        tokenizer,
        batch_tokens=256,
        max_length=max_length,
        bucket_boundaries=boundaries,
        num_replicas=1,
        truncate=True,
    )
    out = _collect(truncated, boundaries, 256)
    assert collections.Counter(out) == collections.Counter(
        _expected_examples(pairs, tokenizer, max_length=max_length, truncate=True)
    )
    assert len(out) == len(pairs)


def test_make_batches_replica_multiple_and_drop_remainder(tokenizer):
    ds = corpora.load_multi30k("test2016")
    boundaries = data.default_bucket_boundaries(64)
    kwargs = dict(batch_tokens=768, max_length=64, seed=1)
    batches = data.make_batches(ds, tokenizer, num_replicas=3, **kwargs)
    out = _collect(batches, boundaries, 768, 3)
    # Every pair is kept: partial batches are filled up to a multiple of 3 with empty rows, not cut.
    expected = _expected_examples(
        zip(corpora.read_lines("test2016", "en"), corpora.read_lines("test2016", "de")), tokenizer, max_length=64
    )
    assert collections.Counter(out) == collections.Counter(expected)
    rows = sum(src.shape[0] for (src, _), _ in batches.as_numpy_iterator())
    assert rows > len(out)  # some batch was filled: the test means something

    full = data.make_batches(ds, tokenizer, num_replicas=1, drop_remainder=True, **kwargs)
    sizes = dict(zip(boundaries, data.bucket_batch_sizes(boundaries, 768)))
    shapes = [src.shape for (src, _), _ in full.as_numpy_iterator()]
    assert all(batch == sizes[length] for batch, length in shapes)
    # A dataset of known size is one pool, so the number of batches per epoch is
    # whole_batches(n, sizes) whatever the order of the pairs (the trainer relies on it).
    expected = _expected_examples(
        zip(corpora.read_lines("test2016", "en"), corpora.read_lines("test2016", "de")), tokenizer, max_length=64
    )
    per_bucket = collections.Counter(min(b for b in boundaries if b >= max(len(s), len(t))) for s, t in expected)
    assert len(shapes) == data.whole_batches([per_bucket[b] for b in boundaries], [sizes[b] for b in boundaries])
    assert len(shapes) > sum(n // sizes[b] for b, n in per_bucket.items())  # leftovers made whole batches


def test_whole_batches_lose_no_bucket_only_the_longest_bucket_s_leftovers(tokenizer):
    """With drop_remainder, a bucket's leftover pairs join the next longer bucket (padded to its boundary),
    so a bucket with fewer pairs than one batch is not left out of every pass; only fewer than one batch
    of the longest bucket is dropped, and those are other pairs in each pass."""
    assert data.whole_batches([5, 10, 3], [8, 4, 2]) == 0 + 3 + 3  # 5 carried: 15 (3 batches, 3 carried): 6 (3)
    assert data.whole_batches([], []) == 0
    pairs = list(zip(corpora.read_lines("test2016", "en"), corpora.read_lines("test2016", "de")))
    boundaries, budget = [8, 16, 24, 32, 64], 768
    sizes = data.bucket_batch_sizes(boundaries, budget)
    expected = _expected_examples(pairs, tokenizer, max_length=64)
    shortest = [e for e in expected if max(len(e[0]), len(e[1])) <= 8]
    assert 0 < len(shortest) < sizes[0]  # fewer than one batch: this bucket used to be dropped whole
    ds = tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*pairs))))
    passes = []
    batches = data.make_batches(
        ds,
        tokenizer,
        batch_tokens=budget,
        max_length=64,
        bucket_boundaries=boundaries,
        num_replicas=1,
        drop_remainder=True,
        seed=3,
    )
    for _ in range(2):
        examples = []
        for (src, tgt_in), _ in batches.as_numpy_iterator():
            assert src.shape[0] == sizes[boundaries.index(src.shape[1])]  # only whole batches
            examples += [(_strip(s), _strip(t)) for s, t in zip(src, tgt_in)]
        passes.append(examples)
        assert set(shortest) <= set(examples)  # padded to 16 with the next bucket's pairs
        assert len(expected) - sizes[-1] < len(examples) <= len(expected) and len(set(examples)) == len(examples)
    assert set(passes[0]) != set(passes[1])  # the longest bucket's leftovers differ between passes


def test_boundaries_past_max_length_are_cut_to_it():
    assert data.checked_bucket_boundaries([8, 16, 300, 400], 32) == [8, 16, 32]
    assert data.checked_bucket_boundaries([8, 32], 32) == [8, 32]
    with pytest.raises(ValueError, match="last bucket boundary"):
        data.checked_bucket_boundaries([8, 16], 32)


def test_make_batches_is_deterministic_and_reshuffles(tokenizer):
    ds = corpora.load_multi30k("test2016").take(400)

    def epoch(batches):
        return [x[0].tolist() for x, _ in batches.as_numpy_iterator()]

    kwargs = dict(batch_tokens=256, max_length=64, num_replicas=1)
    a = data.make_batches(ds, tokenizer, seed=7, **kwargs)
    b = data.make_batches(ds, tokenizer, seed=7, **kwargs)
    first = epoch(a)
    assert first == epoch(b)
    assert first != epoch(a)  # the next epoch is reshuffled
    # Batches are not emitted bucket by bucket: lengths interleave, also without shuffling.
    lengths = [len(batch[0]) for batch in first]
    assert lengths != sorted(lengths)
    unshuffled = epoch(data.make_batches(ds, tokenizer, shuffle=False, **kwargs))
    assert unshuffled == epoch(data.make_batches(ds, tokenizer, shuffle=False, seed=3, **kwargs))
    lengths = [len(batch[0]) for batch in unshuffled]
    assert lengths != sorted(lengths)


def test_make_batches_subword_sampling_changes_segmentation_not_pairs(tokenizer):
    pairs = list(zip(corpora.read_lines("val", "en")[:300], corpora.read_lines("val", "de")[:300]))
    ds = tf.data.Dataset.from_tensor_slices(tuple(map(list, zip(*pairs))))
    boundaries = data.default_bucket_boundaries(128)
    kwargs = dict(batch_tokens=1280, max_length=128, num_replicas=1, shuffle=False)
    best = _collect(data.make_batches(ds, tokenizer, **kwargs), boundaries, 1280)
    assert sorted(best) == sorted(_expected_examples(pairs, tokenizer))
    sampled = data.make_batches(ds, tokenizer, sampling_alpha=0.1, **kwargs)
    first, second = (_collect(sampled, boundaries, 1280) for _ in range(2))
    assert len(first) == len(second) == len(pairs)  # every pair, once per pass
    assert sorted(first) != sorted(best) and sorted(first) != sorted(second)  # segmented anew each pass

    def texts(examples):
        sources = tokenizer.detokenize(tf.ragged.constant([s for s, _ in examples])).numpy()
        targets = tokenizer.detokenize(tf.ragged.constant([t for _, t in examples])).numpy()
        return sorted(zip(sources, targets))

    assert texts(first) == texts(best)  # the same sentence pairs


def test_make_batches_repeat(tokenizer):
    ds = corpora.load_multi30k("val").take(50)
    batches = data.make_batches(
        ds, tokenizer, batch_tokens=256, max_length=64, num_replicas=1, repeat=True, pool_size=1024
    )
    rows = sum(x[0].shape[0] for x, _ in batches.take(40).as_numpy_iterator())
    assert rows > 50  # it went past one epoch


def test_make_batches_rejects_bad_settings(tokenizer):
    ds = corpora.load_multi30k("val")
    with pytest.raises(ValueError, match="batch_tokens=100 is too small"):
        data.make_batches(ds, tokenizer, batch_tokens=100, max_length=128, num_replicas=1)
    with pytest.raises(ValueError, match="num_replicas=2"):
        data.make_batches(ds, tokenizer, batch_tokens=200, max_length=128, num_replicas=2)
    with pytest.raises(ValueError, match="last bucket boundary"):
        data.make_batches(ds, tokenizer, max_length=64, bucket_boundaries=[16, 32], num_replicas=1)
    with pytest.raises(ValueError, match="increasing"):
        data.make_batches(ds, tokenizer, max_length=64, bucket_boundaries=[32, 16, 64], num_replicas=1)


def test_default_bucket_boundaries():
    bounds = data.default_bucket_boundaries(256)
    assert bounds[:3] == [8, 16, 24] and bounds[-1] == 256 and all(b % 8 == 0 for b in bounds)
    assert all(b2 >= 1.1 * b1 for b1, b2 in zip(bounds, bounds[1:-1]))
    fine = data.default_bucket_boundaries(256, multiple=1)
    assert fine[:6] == [8, 9, 10, 11, 13, 15] and fine[-1] == 256  # short sentences: little padding
    assert all(b2 >= 1.1 * b1 for b1, b2 in zip(fine, fine[1:-1]))
    assert data.default_bucket_boundaries(100)[-1] == 100
    assert data.default_bucket_boundaries(5) == [5]
    assert data.bucket_batch_sizes([8, 16, 100], 1000, num_replicas=4) == [124, 60, 8]


@pytest.mark.parametrize("num_replicas", [1, 4])
def test_token_budget_stats(tokenizer, num_replicas):
    """Every validation pair is counted once, and with 4 replicas not the empty rows that fill partial batches."""
    batches = data.make_batches(
        corpora.load_multi30k("val"), tokenizer, batch_tokens=1024, max_length=128, num_replicas=num_replicas
    )
    stats = data.token_budget_stats(batches)
    assert stats["num_examples"] == 1014
    rows = sum(src.shape[0] for (src, _), _ in batches.as_numpy_iterator())
    assert rows > 1014 if num_replicas == 4 else rows == 1014  # with 4 replicas, some batch was filled
    assert stats["max_batch_tokens"] <= 1024
    assert 0 < stats["padding_ratio"] < 0.5
    assert stats["pad_tokens"] + stats["source_tokens"] + stats["target_tokens"] == stats["padded_tokens"]


_DISTRIBUTED_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import tensorflow as tf

    # Two logical CPUs: must happen before TensorFlow initializes its devices.
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from keras_transformer import data
    from keras_transformer.data import corpora
    from keras_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(sys.argv[1])
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    ds = corpora.load_multi30k("val")
    kwargs = dict(batch_tokens=600, max_length=64, shuffle=False)
    with strategy.scope():
        batches = data.make_batches(ds, tokenizer, **kwargs)  # num_replicas from the strategy
    reference = list(data.make_batches(ds, tokenizer, num_replicas=2, **kwargs).as_numpy_iterator())

    report = {"replicas": strategy.num_replicas_in_sync, "batches": 0, "rows": 0, "errors": []}
    for (inputs, targets), ((ref_src, ref_tgt_in), ref_tgt_out) in zip(
            strategy.experimental_distribute_dataset(batches), reference):
        parts = [t.numpy() for t in strategy.experimental_local_results(inputs[0])]
        sizes = [p.shape[0] for p in parts]
        if sum(sizes) != ref_src.shape[0] or len(set(sizes)) != 1:
            report["errors"].append(f"global {ref_src.shape} split into {sizes}")
        if not np.array_equal(np.concatenate(parts), ref_src):
            report["errors"].append("per-replica rows differ from the global batch")
        report["batches"] += 1
        report["rows"] += int(ref_src.any(axis=1).sum())  # not the empty rows that fill a partial batch
    report["reference_batches"] = len(reference)
    single = data.make_batches(ds, tokenizer, num_replicas=1, **kwargs)
    report["pairs"] = sum(int(src.shape[0]) for (src, _), _ in single.as_numpy_iterator())  # within max_length
    print("RESULT " + json.dumps(report))
    """
)


def test_make_batches_split_evenly_over_two_replicas(tokenizer, tmp_path):
    model = tokenizer.save(tmp_path / "spm.model")
    env = dict(
        os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2"
    )
    proc = subprocess.run(
        [sys.executable, "-c", _DISTRIBUTED_SCRIPT, model],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")][-1]
    report = json.loads(line[len("RESULT ") :])
    assert report["replicas"] == 2
    assert report["errors"] == []
    assert report["batches"] == report["reference_batches"] > 0
    assert report["rows"] == report["pairs"] > 1000  # every pair one device gets, none cut to split evenly


def test_make_batches_empty_input_and_everything_too_long(tokenizer):
    empty = tf.data.Dataset.from_tensor_slices((tf.constant([], tf.string), tf.constant([], tf.string)))
    assert list(data.make_batches(empty, tokenizer, num_replicas=1)) == []
    long = tf.data.Dataset.from_tensor_slices((["A man in an orange hat."] * 3, ["Ein Mann."] * 3))
    assert list(data.make_batches(long, tokenizer, max_length=4, num_replicas=1)) == []
