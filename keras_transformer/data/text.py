"""Parallel text files -> `(source_text, target_text)` pairs (Vaswani et al., 2017, §5.1 data).

Every loader of this package gives a `tf.data.Dataset` of scalar `tf.string`
pairs. Text normalization (all loaders): each line is stripped, and runs of
spaces and tabs inside it become a single space (Multi30k `train.de` line 7366
has a TAB inside the sentence). Pairs where either side is then empty are
skipped.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import logging
import os
import re
import zlib
from collections.abc import Sequence

import tensorflow as tf

logger = logging.getLogger(__name__)

_INNER_WHITESPACE = re.compile(r"[ \t\r\f\v]+")


def normalize_line(line: str) -> str:
    """Strips a line and turns each run of spaces/tabs inside it into one space."""
    return _INNER_WHITESPACE.sub(" ", line).strip()


def read_text_lines(path: str | os.PathLike) -> list[str]:
    """Reads a UTF-8 text file (plain or gzip) into normalized lines.

    One entry per line of the file, in order (blank lines are kept as `""` so
    line numbers still line up); lines are split on `"\\n"` only, and each line
    goes through `normalize_line`. A UTF-8 byte-order mark is ignored.

    Args:
        path: file path; gzip files are detected by content, not by name.

    Raises:
        ValueError: if the file is missing, unreadable, a broken gzip stream,
            or not valid UTF-8 (the message names the file, and the 1-based
            line number).
    """
    path = os.fspath(path)
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            data = f.read()
    except tf.errors.NotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except tf.errors.OpError as error:
        reason = "a directory, not a file" if tf.io.gfile.isdir(path) else error.message
        raise ValueError(f"{path} cannot be read ({reason})") from None
    return decode_text_lines(data, path)


def decode_text_lines(data: bytes, name: str) -> list[str]:
    """`read_text_lines` of a file's bytes (plain or gzip), e.g. standard input's; `name` goes in errors."""
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.GzipFile(fileobj=io.BytesIO(data)).read()
        except (OSError, EOFError, zlib.error) as error:
            raise ValueError(f"{name}: broken gzip data ({error})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line_number = data.count(b"\n", 0, err.start) + 1
        raise ValueError(
            f"{name}: line {line_number}: invalid UTF-8 ({err.reason}, byte {data[err.start : err.start + 1]!r})"
        ) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    # str.splitlines() would also split on U+2028, U+0085, ... and so break
    # the line alignment of parallel files; split on LF only.
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # final newline
    return [normalize_line(line) for line in lines]


def check_text_file(path: str | os.PathLike) -> dict:
    """Reads a text file once, as `read_text_lines` would, and describes it; refuses what it could not read.

    Streams the file (plain or gzip) in blocks: its memory does not grow with
    its size. The line count is `len(read_text_lines(path))`.

    Returns:
        `{"path": path, "lines": number of lines, "sha256": of the file's bytes}`.

    Raises:
        ValueError: the file is missing, a directory, unreadable, empty, or
            not valid UTF-8 (the message names the file, and the line).

    Example:
        >>> import tempfile
        >>> with tempfile.NamedTemporaryFile("wb", suffix=".en") as f:
        ...     _ = f.write("Zwei Männer.\\nA dog\\n\\nno final newline".encode())
        ...     f.flush()
        ...     check_text_file(f.name)["lines"]
        4
    """
    import codecs
    import hashlib

    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no such file")
    if os.path.isdir(path):
        raise ValueError(f"{path} is a directory, not a file")
    digest = hashlib.sha256()
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    lines, last, size, first = 0, b"\n", 0, b""
    try:
        with open(path, "rb") as raw:
            for block in iter(lambda: raw.read(1 << 20), b""):
                digest.update(block)
            raw.seek(0)
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            stream = gzip.GzipFile(fileobj=raw) if gzipped else raw
            while block := stream.read(1 << 20):
                try:
                    decoder.decode(block)
                except UnicodeDecodeError as err:
                    line = lines + block.count(b"\n", 0, err.start) + 1
                    raise ValueError(f"{path}: line {line}: invalid UTF-8 ({err.reason})") from None
                lines += block.count(b"\n")
                first = first or block[: len(codecs.BOM_UTF8)]
                last, size = block[-1:], size + len(block)
        decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:  # a character cut at the end of the file
        raise ValueError(f"{path}: line {lines + 1}: invalid UTF-8 ({err.reason})") from None
    except (OSError, EOFError) as error:  # unreadable, a broken gzip stream
        raise ValueError(f"{path} cannot be read ({getattr(error, 'strerror', None) or error})") from None
    if size == 0 or (size == len(codecs.BOM_UTF8) and first == codecs.BOM_UTF8):  # read_text_lines skips a BOM
        raise ValueError(f"{path} is empty")
    return {"path": path, "lines": lines + (last != b"\n"), "sha256": digest.hexdigest()}


@dataclasses.dataclass(frozen=True)
class ParallelTextStats:
    """What `load_parallel_text` read.

    Attributes:
        source_path, target_path: the files.
        num_lines: lines per file.
        num_pairs: pairs in the dataset (`num_lines - num_skipped`).
        skipped_line_numbers: 1-based line numbers of pairs skipped because the
            source or target line was empty or whitespace-only.
    """

    source_path: str
    target_path: str
    num_lines: int
    num_pairs: int
    skipped_line_numbers: tuple[int, ...]

    @property
    def num_skipped(self) -> int:
        return len(self.skipped_line_numbers)


def _string_dataset(sources: Sequence[str], targets: Sequence[str]) -> tf.data.Dataset:
    return tf.data.Dataset.from_tensor_slices(
        (tf.constant(list(sources), dtype=tf.string), tf.constant(list(targets), dtype=tf.string))
    )


def load_parallel_text(
    src_path: str | os.PathLike,
    tgt_path: str | os.PathLike,
    *,
    return_stats: bool = False,
):
    """Loads two line-aligned text files as `(source_text, target_text)` pairs.

    The files are read with Python (`read_text_lines`: plain or gzip, strict
    UTF-8, normalized whitespace) and then sliced into a dataset; this is meant
    for corpora that fit in memory (Multi30k is 4 MB).

    Args:
        src_path: source-language file, one sentence per line.
        tgt_path: target-language file, line *i* translating line *i* of src_path.
        return_stats: also return a `ParallelTextStats`.

    Returns:
        `tf.data.Dataset` of scalar `tf.string` pairs, or
        `(dataset, stats)` if `return_stats`. Pairs with an empty side are
        skipped; their number is logged as a warning and given in the stats.

    Raises:
        ValueError: if the files have different line counts (names both files
            and counts), no pair has text on both sides, or a file cannot be
            read (`read_text_lines`: names the file, and the line).
    """
    src_path, tgt_path = os.fspath(src_path), os.fspath(tgt_path)
    sources = read_text_lines(src_path)
    targets = read_text_lines(tgt_path)
    if len(sources) != len(targets):
        raise ValueError(
            "Parallel files have different line counts: "
            f"{src_path} has {len(sources)} lines, {tgt_path} has {len(targets)} lines"
        )
    skipped = tuple(i + 1 for i, (s, t) in enumerate(zip(sources, targets)) if not s or not t)
    if len(skipped) == len(sources):
        raise ValueError(f"{src_path} / {tgt_path}: no pair has text on both sides ({len(sources)} lines)")
    if skipped:
        logger.warning(
            "Skipped %d of %d pairs with an empty side in %s / %s (lines %s%s)",
            len(skipped),
            len(sources),
            src_path,
            tgt_path,
            ", ".join(map(str, skipped[:10])),
            ", ..." if len(skipped) > 10 else "",
        )
        keep = set(range(len(sources))) - {n - 1 for n in skipped}
        sources = [s for i, s in enumerate(sources) if i in keep]
        targets = [t for i, t in enumerate(targets) if i in keep]
    dataset = _string_dataset(sources, targets)
    if not return_stats:
        return dataset
    stats = ParallelTextStats(
        source_path=src_path,
        target_path=tgt_path,
        num_lines=len(sources) + len(skipped),
        num_pairs=len(sources),
        skipped_line_numbers=skipped,
    )
    return dataset, stats


# What str.strip() strips (str.isspace: the Unicode categories Zs, Zl, Zp and the
# separators and controls below); tf.strings.strip strips ASCII whitespace only.
_EDGE_WHITESPACE = r"[\t-\r\x1c-\x1f\x{85}\p{Z}]+"


def normalize_in_graph(text: tf.Tensor) -> tf.Tensor:
    """`normalize_line` as TensorFlow ops (for streamed data such as tfds): the same strings out."""
    text = tf.strings.regex_replace(text, r"[ \t\r\f\v]+", " ")
    return tf.strings.regex_replace(text, f"^{_EDGE_WHITESPACE}|{_EDGE_WHITESPACE}$", "")
