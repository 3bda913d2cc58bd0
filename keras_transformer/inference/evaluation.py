"""Corpus-level translation scores: sacreBLEU, chrF and lower-cased tokenized BLEU.

Pure Python (sacrebleu, sacremoses); no TensorFlow.

Three numbers, because published results use different ones:

- **BLEU, cased, detokenized** (sacreBLEU's default 13a tokenization; Post,
  2018): the comparable number, reported with its signature. Vaswani et al.
  (2017) report tokenized BLEU on newstest2014 (Table 2); sacreBLEU on the
  same outputs is typically somewhat lower.
- **chrF** (Popović, 2015), with its signature.
- **BLEU, lower-cased, Moses-tokenized**: hypotheses and references are
  lower-cased, punctuation-normalized and tokenized with the Moses scripts of
  the target language (sacremoses; exactly how the official Multi30k
  tokenized references were made), and scored by sacreBLEU without further
  tokenization (`tokenize="none"`). This is the usual Multi30k metric (multi-bleu.perl on
  lower-cased tokenized text), e.g. the 41.0 of fairseq's transformer_tiny on
  test2016 en→de; it is higher than cased detokenized BLEU.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

__all__ = ["corpus_scores", "format_scores", "moses_tokenize_lowercase"]


@functools.cache
def _moses(lang: str):
    from sacremoses import MosesPunctNormalizer, MosesTokenizer

    return MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)


def moses_tokenize_lowercase(lines: Sequence[str], lang: str) -> list[str]:
    """The Multi30k references' pipeline: lower-case, Moses punctuation normalization, Moses tokenization.

    The official tokenized references (`test_2016_flickr.lc.norm.tok.de`) were
    made by `lowercase.perl`, `normalize-punctuation.perl -l LANG` and
    `tokenizer.perl -l LANG` (with its default escaping, without `-a`); this
    is the same pipeline in sacremoses, and it reproduces that file from the
    raw references line for line (tested). Hypotheses go through it too.
    """
    normalizer, tokenizer = _moses(lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), escape=True, return_str=True) for line in lines]


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str], lang: str = "de") -> dict:
    """Scores a test set translated sentence by sentence (one reference per sentence).

    Args:
        hypotheses: system outputs, detokenized text.
        references: reference translations, same length and order.
        lang: target language, for the Moses tokenizer of the tokenized BLEU.

    Returns:
        dict with
        `bleu`, `bleu_signature`, `bleu_details` (cased sacreBLEU, 13a),
        `chrf`, `chrf_signature`,
        `tok_bleu`, `tok_bleu_signature`, `tok_bleu_details` (lower-cased,
        Moses-tokenized, sacreBLEU with `tokenize="none"`),
        and `sentences`.

    Raises:
        ValueError: if the lists differ in length or are empty.
    """
    from sacrebleu.metrics import BLEU, CHRF

    hypotheses = [str(h) for h in hypotheses]
    references = [str(r) for r in references]
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references.")
    if not hypotheses:
        raise ValueError("No sentences to score.")

    bleu = BLEU()
    bleu_result = bleu.corpus_score(hypotheses, [references])
    chrf = CHRF()
    chrf_result = chrf.corpus_score(hypotheses, [references])
    tok_bleu = BLEU(tokenize="none", force=True)
    tok_result = tok_bleu.corpus_score(
        moses_tokenize_lowercase(hypotheses, lang), [moses_tokenize_lowercase(references, lang)]
    )
    return {
        "bleu": float(bleu_result.score),
        "bleu_signature": str(bleu.get_signature()),
        "bleu_details": str(bleu_result),
        "chrf": float(chrf_result.score),
        "chrf_signature": str(chrf.get_signature()),
        "tok_bleu": float(tok_result.score),
        "tok_bleu_signature": f"{tok_bleu.get_signature()}|pre:lowercase+moses-norm+moses-tok-{lang}",
        "tok_bleu_details": str(tok_result),
        "sentences": len(hypotheses),
    }


def format_scores(scores: dict) -> str:
    """The three scores of `corpus_scores` as printable lines."""
    return "\n".join(
        [
            f"BLEU (sacreBLEU, cased, detokenized) = {scores['bleu']:.2f}   {scores['bleu_signature']}",
            f"BLEU (lower-cased, Moses-tokenized) = {scores['tok_bleu']:.2f}   {scores['tok_bleu_signature']}",
            f"chrF = {scores['chrf']:.2f}   {scores['chrf_signature']}",
        ]
    )
