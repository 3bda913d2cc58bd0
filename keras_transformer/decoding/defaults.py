"""Decoding defaults of the paper (Vaswani et al., 2017, §6.1), defined once for the whole package.

    "we used beam search with a beam size of 4 and length penalty alpha = 0.6
    [...] We set the maximum output length during inference to input length
    + 50, but terminate early when possible."  (§6.1)

The translator, the SavedModel export, the command line and the benchmarks
take their defaults from here.
"""

import numpy as np

from keras_transformer.errors import ParameterError

# §6.1: beam size and length penalty.
DEFAULT_BEAM_SIZE = 4
DEFAULT_ALPHA = 0.6

# §6.1: maximum output length = input length + 50.
EXTRA_OUTPUT_LENGTH = 50

# How a finished hypothesis's log-probability is normalized by its length |Y| (end token included), the first the
# default: "gnmt", divided by ((5 + |Y|) / 6) ** alpha, the penalty §6.1 cites (Wu et al., 2016, eq. 14); "average",
# divided by |Y| ** alpha, fairseq's `--lenpen`, CTranslate2's `length_penalty` and Marian's `--normalize`.
LENGTH_PENALTIES = ("gnmt", "average")
DEFAULT_LENGTH_PENALTY = LENGTH_PENALTIES[0]
# Each one's score, as an export's `export.json` states it.
SCORE_FORMULAS = {
    "gnmt": "log P(Y|X) / ((5 + |Y|) / 6) ** alpha, |Y| counting the end token",
    "average": "log P(Y|X) / |Y| ** alpha, |Y| counting the end token",
}


def check_length_penalty(length_penalty):
    """Returns `length_penalty` if it is one of `LENGTH_PENALTIES`, else raises a `ParameterError` naming them.

    Example:
        >>> check_length_penalty("average")
        'average'
    """
    if length_penalty not in LENGTH_PENALTIES:
        raise ParameterError("length_penalty", f"must be one of {', '.join(LENGTH_PENALTIES)}, got {length_penalty!r}.")
    return length_penalty


def check_alpha(alpha):
    """Returns `alpha` as a float if it is >= 0 and finite (the length penalty's exponent), else raises a
    `ParameterError`.

    Example:
        >>> check_alpha(0.6)
        0.6
    """
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(alpha, bool) or not 0.0 <= value < float("inf"):
        raise ParameterError("alpha", f"must be >= 0 and finite, got {alpha!r}.")
    return value


# When a sentence's beam search ends (see `beam_search`); the first is the default.
EARLY_STOPPING = ("exact", "k_finished")
DEFAULT_EARLY_STOPPING = EARLY_STOPPING[0]


def check_early_stopping(early_stopping):
    """Returns `early_stopping` if it is one of `EARLY_STOPPING`, else raises a `ParameterError` naming them."""
    if early_stopping not in EARLY_STOPPING:
        raise ParameterError("early_stopping", f"must be one of {', '.join(EARLY_STOPPING)}, got {early_stopping!r}.")
    return early_stopping


def refuse_bad_ids(name, ids, bad, rule):
    """Raises a `ParameterError` naming the first id of `ids [B, L]` where `bad [B, L]` holds, if any.

    Args:
        name: the argument's name, which the message starts with.
        ids: a numpy integer array `[B, L]`.
        bad: a boolean array of the same shape, True where an id is refused.
        rule: what the id should have been, appended to "row R, position C: id X".
    """
    if bad.any():
        row, column = (int(n) for n in np.argwhere(bad)[0])
        raise ParameterError(name, f"row {row}, position {column}: id {ids[row, column]}{rule}")


# Not the paper's: sentences per decoding call of `Translator.translate` (and so of `translate`,
# `evaluate`, validation BLEU and the demo's scoring), which sorts the input by length first; chosen
# by `benchmarks/translate_batching.py` (its figures: `benchmarks/README.md`).
DEFAULT_TRANSLATE_BATCH_SIZE = 256

# Not the paper's: batches `Translator.translate` keeps in flight (threads). A decoding step is a chain of small
# ops that leaves cores idle, so two batches at once keep two cores busier. The command line gives each batch in
# flight its share of the cores (`cli.threads`).
DEFAULT_TRANSLATE_WORKERS = 2

# Log-probability of an impossible event. Finite, so sums and differences never
# give NaN.
NEG_INF = -1e9
