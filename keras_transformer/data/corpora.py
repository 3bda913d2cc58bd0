"""Parallel corpora shipped with the package (no download needed).

* **Multi30k** (WMT16 multimodal task 1, English-German image captions; Elliott
  et al., 2016): `train` 29,000 / `val` 1,014 / `test2016` 1,000 pairs, the
  main data set of this project. Non-commercial research and educational use
  only; see `multi30k/README.md` beside this file for provenance and license.
* **newstest2014** (WMT14 English-German news test set, "full", 3,003
  segments): the test set of Vaswani et al. (2017), Table 2; for evaluation
  only (there is no matching training data here). See `newstest2014/README.md`.

Files are gzip-compressed copies of the original UTF-8 text (one sentence per
line, line *i* of `X.en` translating line *i* of `X.de`).

Example:

    ds = load_multi30k("train", src="en", tgt="de")   # (source_text, target_text)
    refs = read_lines("test2016", "de")                # list[str] for BLEU
"""

from __future__ import annotations

import os

import tensorflow as tf

from keras_transformer.data.text import load_parallel_text, read_text_lines

__all__ = [
    "MULTI30K_SPLITS",
    "MULTI30K_LANGUAGES",
    "NEWSTEST2014_LANGUAGES",
    "multi30k_path",
    "load_multi30k",
    "read_lines",
    "newstest2014_path",
    "load_newstest2014",
    "read_newstest2014",
]

_HERE = os.path.dirname(os.path.abspath(__file__))

MULTI30K_SPLITS = ("train", "val", "test2016")
MULTI30K_LANGUAGES = ("en", "de")
NEWSTEST2014_LANGUAGES = ("en", "de")


def _check(kind: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ValueError(f"Unknown {kind} {value!r}; valid values: {', '.join(valid)}")


def multi30k_path(split: str, lang: str) -> str:
    """Path of the vendored `multi30k/{split}.{lang}.gz`.

    Args:
        split: "train", "val" or "test2016".
        lang: "en" or "de".

    Raises:
        ValueError: for an unknown split or language (names the valid values).
    """
    _check("Multi30k split", split, MULTI30K_SPLITS)
    _check("Multi30k language", lang, MULTI30K_LANGUAGES)
    return os.path.join(_HERE, "multi30k", f"{split}.{lang}.gz")


def load_multi30k(split: str = "train", src: str = "en", tgt: str = "de") -> tf.data.Dataset:
    """Multi30k as a `tf.data.Dataset` of `(source_text, target_text)` scalars.

    Lines are normalized like `keras_transformer.data.load_parallel_text`
    (stripped; the TAB in `train.de` line 7366 becomes a space). No pair is
    skipped: the vendored files have no empty lines.

    Args:
        split: "train" (29000 pairs), "val" (1014) or "test2016" (1000).
        src, tgt: "en" / "de" (either direction).
    """
    return load_parallel_text(multi30k_path(split, src), multi30k_path(split, tgt))


def read_lines(split: str, lang: str) -> list[str]:
    """One side of a Multi30k split as a list of stripped lines (e.g. BLEU references)."""
    return read_text_lines(multi30k_path(split, lang))


def newstest2014_path(lang: str) -> str:
    """Path of the vendored `newstest2014/newstest2014.{lang}.gz` ("en" or "de")."""
    _check("newstest2014 language", lang, NEWSTEST2014_LANGUAGES)
    return os.path.join(_HERE, "newstest2014", f"newstest2014.{lang}.gz")


def load_newstest2014(src: str = "en", tgt: str = "de") -> tf.data.Dataset:
    """newstest2014 (3003 pairs) as `(source_text, target_text)`; test set only."""
    return load_parallel_text(newstest2014_path(src), newstest2014_path(tgt))


def read_newstest2014(lang: str) -> list[str]:
    """One side of newstest2014 as a list of stripped lines (3003)."""
    return read_text_lines(newstest2014_path(lang))
