"""Target prefixes of text: each translation starts with a given text, and the search continues it.

Not in the paper: CTranslate2's `target_prefix`, fairseq's `--prefix-size`,
Sockeye's `target_prefix`, for interactive translation (a translator types the
beginning of a translation, the model completes it), terminology and
autocompletion. `Translator.translate(sentences, target_prefixes=...)`, the
exported signature "translate_with_prefix" (`Translator.translate_with_prefix`)
and `translate --target-prefix FILE` take one prefix per sentence, "" for none.

A prefix is read as a source sentence is (cut to `max_input_bytes`,
normalized, split into SentencePiece subwords) but without an end token, and
its subwords are forced, one per output position
(`keras_transformer.decoding.prefixes`), as CTranslate2 forces the tokens of
its prefix. A prefix of whole words gives a translation that starts with it
(after detokenization, as SentencePiece normalizes it). A prefix that ends
inside a word forces the subwords of that fragment, which need not be the
subwords of the whole word: "Ein Hu" may split as "▁Ein ▁H u", whose
continuation "nd" the model may find less likely than it finds "▁Hund" after
"▁Ein"; the search still continues from the fragment, but autocompletion
works best with prefixes cut at a word boundary. A blank sentence still gets
an empty translation, whatever its prefix.

This module checks prefixes before any decoding, so that a bad one is one
line naming `target_prefixes` (the command line: `--target-prefix`), not an
error from inside the graph.
"""

from keras_transformer.errors import ParameterError
from keras_transformer.inference.sentences import cut_to_bytes


def checked_target_prefixes(translator, sentences, target_prefixes):
    """`target_prefixes` as a list of str (None entries as ""), once they fit `sentences` (a list of str).

    Raises:
        ParameterError: naming `target_prefixes`: not one per sentence, an
            entry not a str, a translator that takes no prefixes, or a
            prefix with more subwords than its sentence's translation may
            have (`overlong_prefixes`).
    """
    prefixes = ["" if prefix is None else prefix for prefix in target_prefixes]
    if len(prefixes) != len(sentences):
        raise ParameterError(
            "target_prefixes",
            f"has {len(prefixes)} prefixes for {len(sentences)} sentences (one per sentence, an empty one for none).",
        )
    for index, prefix in enumerate(prefixes):
        if not isinstance(prefix, str):
            raise ParameterError("target_prefixes", f"prefix {index + 1}: must be a str, got {type(prefix).__name__}.")
    if not hasattr(translator, "translate_with_prefix"):
        raise ParameterError(
            "target_prefixes", f"cannot be given: a {type(translator).__name__} decodes without target prefixes."
        )
    overlong = overlong_prefixes(translator, sentences, prefixes)
    if overlong:
        index, pieces, limit = overlong[0]
        raise ParameterError(
            "target_prefixes",
            f"prefix {index + 1}: {pieces} subwords, more than the {limit} tokens the translation of sentence "
            f"{index + 1} may have (its subwords and end token + max_extra_length {translator.max_extra_length}"
            f"{'' if len(overlong) == 1 else f'; {len(overlong) - 1} more prefixes too long'}).",
        )
    return prefixes


def overlong_prefixes(translator, sentences, prefixes):
    """`(index, pieces, limit)` of each prefix longer than its sentence's translation may be.

    A sentence of n subwords (after the cut to `max_input_bytes`; at most
    `max_input_length - 1` are read) has a translation of at most
    `n + 1 + max_extra_length` tokens (§6.1's input length + 50), and no more
    than `output_length_cap` with learned positions. A blank sentence has no
    limit (its translation is empty). Nothing is found where the translator
    does not say its limits (`max_extra_length` None).
    """
    rows = [index for index, prefix in enumerate(prefixes) if prefix]
    extra = getattr(translator, "max_extra_length", None)
    if not rows or extra is None:
        return []
    max_bytes = getattr(translator, "max_input_bytes", None)
    read = translator.max_input_length - 1 if getattr(translator, "max_input_length", None) else None
    cap = getattr(translator, "output_length_cap", None)
    sources = translator.source_pieces([cut_to_bytes(sentences[row], max_bytes) for row in rows])
    pieces = translator.source_pieces([cut_to_bytes(prefixes[row], max_bytes) for row in rows])
    found = []
    for row, source, count in zip(rows, sources, pieces):
        if source == 0:
            continue
        limit = min(source, read or source) + 1 + extra
        limit = min(limit, cap) if cap else limit
        if count > limit:
            found.append((row, int(count), int(limit)))
    return found
