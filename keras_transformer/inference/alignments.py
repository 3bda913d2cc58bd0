"""Word alignments from the encoder-decoder attention, in Pharaoh format (not in the paper).

fairseq's `--print-alignment`, Marian's `--alignment` and OpenNMT-tf's
alignments: which source word each word of a translation comes from, read
off the encoder-decoder attention of one decoder layer (§3.2.3), as the
"i-j" pairs of the Pharaoh format (0-based source word i, target word j,
sorted by j), e.g. "0-0 1-1 3-2 2-3".

How `align_ids` computes them for a source and its translation (subword ids):

1. One teacher-forced pass of the model over the source and the translation
   (`Transformer.attention_weights`; the start token, then the translation
   shifted right). The decoder is causal, so row t of its encoder-decoder
   attention is the attention of the search's step t, the one that chose
   target subword t. Of the layer `layer` (default the last, as fairseq's
   `alignment_layer`; negative indices count from the last), the weights
   are averaged over the heads (fairseq averages all heads too). An
   `Ensemble` averages its members' with its weights (fairseq averages the
   attention of an ensemble's models).
2. Rows and columns of the start, end and padding tokens are dropped (fairseq's
   `extract_hard_alignment` drops the end token and padding too).
3. Subwords are folded into words (`word_membership`): the words are those
   of the detokenized text as `str.split()` splits it, i.e. maximal runs of
   characters other than whitespace and SentencePiece's word marker "▁"
   (U+2581). A subword belongs to the words it has characters of (a bare
   "▁" to the word after it); for SentencePiece's usual subwords, which never
   hold a "▁" but in front, a word is a subword that starts with "▁" and the
   subwords after it up to the next such one. An unknown subword (<unk>) is
   read as SentencePiece detokenizes it, " ⁇ ", a word of its own; a
   character spelled in bytes (byte fallback) as its byte subwords, so a
   whitespace character the vocabulary lacks separates no words.
4. The weight of source word i for target word j (`fold`) is the sum of the
   attention over the subwords of i, averaged over the subwords of j.
   Summed over a source word: each attention row is a probability
   distribution over source positions, so a word's weight is the
   probability that the row looks at any of its subwords, and a word split
   into many subwords is neither favoured nor penalized against one left
   whole (a mean would halve a two-subword word whose second subword draws
   nothing, a maximum would ignore the second). Averaged over a target word:
   each of its subwords has its own distribution over the source, and their
   mean is still one, whatever the number of subwords. (fairseq's
   `extract_hard_alignment` works on tokens: each target token is aligned to
   the source token of highest attention and tokens are words, so its
   subword-level output has one pair per target subword; here there is one
   pair per target word.)
5. Each target word j is aligned to the source word i of highest weight
   (the first of equal ones): one "i-j" per target word, sorted by j. A
   translation or a source without words has the alignment "".

Everything is TensorFlow ops (strings, ragged and segment ops), so the same
code runs eagerly, in `Translator`'s `tf.function`s and in the exported
SavedModel's `translate_with_alignments` signature. `Translator.translate(...,
alignments=True)` and `translate --alignments` use it.
"""

import tensorflow as tf

from keras_transformer.errors import ParameterError
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# SentencePiece's word marker, which stands for a space in front of a subword.
WORD_MARKER = "\u2581"
# How SentencePiece detokenizes <unk> (its default `unk_surface`, " \u2047 "), with word markers for the spaces.
UNK_SURFACE = WORD_MARKER + "\u2047" + WORD_MARKER
# What separates words: the whitespace of Python's `str.split()` (RE2's \p{Z}, the ASCII controls it counts, U+0085)
# and the word marker.
_SEPARATOR = r"[\t\n\x0b\x0c\r\x1c-\x1f\x{85}\p{Z}\x{2581}]"


def alignment_layer_index(model, layer):
    """`layer` as an index of `model`'s decoder layers, counted from 0, once it is one.

    Args:
        model: a `Transformer`, or an `Ensemble` (each member is checked).
        layer: an int; negative counts from the last layer (-1: the last).

    Returns:
        The index, from 0 (`layer` itself for an ensemble, whose members may differ in depth, or a model
        whose config has no `num_layers`).

    Raises:
        ParameterError: ("alignment_layer") not an int, or out of range, naming the number of layers.
    """
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise ParameterError("alignment_layer", f"must be an integer, got {layer!r}.")
    members = getattr(model, "members", None)
    if members is not None:
        for member in members:
            alignment_layer_index(member, layer)
        return layer
    count = getattr(model.config, "num_layers", None)
    if count is None:  # a model of its own that does not say (it needs `attention_weights` to align)
        return layer
    if not -count <= layer < count:
        raise ParameterError(
            "alignment_layer",
            f"must be between -{count} and {count - 1} (the model's decoder has {count} layer"
            f"{'s' if count > 1 else ''}; negative counts from the last), got {layer}.",
        )
    return layer % count


def cross_attention(model, source_ids, target_in, layer=-1):
    """The encoder-decoder attention of decoder layer `layer`, averaged over the heads: float32 `[B, T, S]`.

    Args:
        model: a `Transformer`, or an `Ensemble` (its members' weighted mean).
        source_ids: int `[B, S]`, 0-padded.
        target_in: int `[B, T]`, the decoder inputs (the start token, then the target shifted right).
        layer: the decoder layer (negative: from the last).
    """
    members = getattr(model, "members", None)
    if members is not None:
        return tf.add_n(
            [weight * cross_attention(m, source_ids, target_in, layer) for weight, m in zip(model.weights, members)]
        )
    weights = model.attention_weights(source_ids, target_in).cross[layer]  # [B, h, T, S]
    return tf.reduce_mean(tf.cast(weights, tf.float32), axis=1)


def piece_strings(tokenizer, ids):
    """The subwords of `ids` int `[B, L]` as strings `[B, L]`: "" for padding, start and end tokens and all
    after the first end token (what `Tokenizer.detokenize` drops), `UNK_SURFACE` for <unk>."""
    ids = tf.cast(ids, tf.int32)
    before_end = tf.equal(tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32), axis=1), 0)
    real = before_end & tf.not_equal(ids, PAD_ID) & tf.not_equal(ids, BOS_ID)
    pieces = tf.where(tf.equal(ids, UNK_ID), UNK_SURFACE, tokenizer.id_to_piece(ids))
    return tf.where(real, pieces, "")


def word_membership(pieces):
    """Which words of its sentence each subword belongs to.

    The words of a sentence are the maximal runs of characters of its
    subwords, taken in order, other than whitespace and "▁": the words
    `str.split()` finds in the detokenized text. A subword belongs to each
    word it has characters of; a subword of only "▁" or whitespace to the word
    after it (to none at the end of the sentence).

    Args:
        pieces: tf.string `[B, L]`, a sentence's subwords per row ("" for none: `piece_strings`).

    Returns:
        `(membership, words)`: float32 `[B, L, W]`, 1 where subword l belongs
        to word w, else 0 (W: the most words of a row, at least 1); and int32
        `[B]`, the number of words of each row.

    Example:
        >>> membership, words = word_membership(tf.constant([["▁A", "▁d", "og", "▁", "(", "x", ")"]]))
        >>> int(words[0]), tf.argmax(membership[0], axis=1).numpy().tolist()
        (3, [0, 1, 1, 2, 2, 2, 2])
    """
    shape = tf.shape(pieces)
    rows, length = shape[0], shape[1]
    chars = tf.strings.unicode_split(tf.reshape(pieces, [-1]), "UTF-8", errors="replace")  # [B * L, (C)]
    piece = tf.cast(chars.value_rowids(), tf.int32)  # the subword of each character, row after row
    row = piece // tf.maximum(length, 1)
    separator = tf.strings.regex_full_match(chars.flat_values, _SEPARATOR)
    # A word starts at a character that is no separator and follows one, or starts its row.
    row_start = tf.not_equal(row, tf.concat([[-1], row], 0)[:-1])
    after_separator = tf.concat([[True], separator], 0)[:-1] | row_start
    starts = tf.cast(~separator & after_separator, tf.int32)
    words = tf.math.unsorted_segment_sum(starts, row, rows)
    begun = tf.cumsum(starts) - tf.gather(tf.cumsum(words, exclusive=True), row)  # words begun so far in the row
    word = begun - tf.cast(~separator, tf.int32)  # a subword of separators belongs to the word after it ...
    spelled = tf.math.unsorted_segment_max(tf.cast(~separator, tf.int32), piece, rows * length) > 0
    word = tf.where((word < tf.gather(words, row)) & ~(separator & tf.gather(spelled, piece)), word, -1)  # ... if any
    width = tf.maximum(tf.reduce_max(tf.concat([words, [1]], 0)), 1)
    hits = tf.math.unsorted_segment_sum(tf.one_hot(word, width), piece, rows * length)  # one_hot(-1): zeros
    return tf.reshape(tf.minimum(hits, 1.0), [rows, length, width]), words


def fold(attention, source_membership, target_membership):
    """Subword attention `[B, T, S]` -> word weights `[B, Wt, Ws]`: summed over the subwords of a source word,
    averaged over those of a target word (the module docstring says why).

    Args:
        attention: float32 `[B, T, S]`, row t the attention of target subword t over the source subwords.
        source_membership: float32 `[B, S, Ws]` (`word_membership` of the source).
        target_membership: float32 `[B, T, Wt]` (`word_membership` of the target).
    """
    by_source_word = tf.einsum("bts,bsi->bti", attention, source_membership)
    totals = tf.einsum("btj,bti->bji", target_membership, by_source_word)
    pieces = tf.reduce_sum(target_membership, axis=1)  # [B, Wt]
    return totals / tf.maximum(pieces, 1.0)[:, :, None]


def pharaoh(weights, source_words, target_words):
    """The Pharaoh alignment of each row: "i-j" for each target word j, i its source word of highest weight.

    Args:
        weights: float32 `[B, Wt, Ws]` (`fold`).
        source_words, target_words: int32 `[B]`, the number of words of each row's source and target.

    Returns:
        tf.string `[B]`, "i-j" pairs sorted by j and joined by spaces; "" without source or target words.

    Example:
        >>> weights = tf.constant([[[0.1, 0.9, 0.0], [0.7, 0.2, 0.0]]])
        >>> pharaoh(weights, tf.constant([2]), tf.constant([2])).numpy()[0].decode()
        '1-0 0-1'
    """
    shape = tf.shape(weights)
    real = tf.range(shape[2])[None, None, :] < source_words[:, None, None]
    best = tf.argmax(tf.where(real, weights, -1.0), axis=2, output_type=tf.int32)  # [B, Wt]
    pairs = tf.strings.as_string(best) + "-" + tf.strings.as_string(tf.range(shape[1]))[None, :]
    lengths = tf.where(source_words > 0, tf.minimum(target_words, shape[1]), 0)
    return tf.strings.reduce_join(tf.RaggedTensor.from_tensor(pairs, lengths=lengths), axis=1, separator=" ")


def align_ids(model, tokenizer, source_ids, token_ids, layer=-1):
    """The Pharaoh word alignment of each source and its translation, from the attention of decoder layer `layer`.

    Args:
        model: the `Transformer` (or `Ensemble`) that translated.
        tokenizer: its `Tokenizer`.
        source_ids: int `[B, S]`, the source subwords, end token, padding (`Translator.source_ids`).
        token_ids: int `[B, L]`, the translations' subwords, end token, padding (the search's output, no
            start token).
        layer: the decoder layer whose attention aligns (-1: the last; `alignment_layer_index` checks it).

    Returns:
        tf.string `[B]`, e.g. "0-0 1-1 3-2 2-3" (the module docstring says how).
    """
    source_ids, token_ids = tf.cast(source_ids, tf.int32), tf.cast(token_ids, tf.int32)
    start = tf.fill([tf.shape(token_ids)[0], 1], BOS_ID)
    target_in = tf.concat([start, token_ids], axis=1)[:, : tf.shape(token_ids)[1]]  # row t: the step that chose t
    attention = cross_attention(model, source_ids, target_in, layer)
    source, source_words = word_membership(piece_strings(tokenizer, source_ids))
    target, target_words = word_membership(piece_strings(tokenizer, token_ids))
    return pharaoh(fold(attention, source, target), source_words, target_words)


def parse_alignment(text):
    """A Pharaoh alignment string -> a list of `(source word, target word)` pairs.

    Example:
        >>> parse_alignment("0-0 2-1 1-2")
        [(0, 0), (2, 1), (1, 2)]
    """
    return [tuple(int(index) for index in pair.split("-")) for pair in text.split()]
