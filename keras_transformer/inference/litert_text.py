"""Sentences to source ids and output ids to sentences, in TensorFlow ops that LiteRT runs.

The in-process `Translator` and the SavedModel read a sentence with
TensorFlow's string ops (`unicode_transcode`, `regex_replace`) and tokenize
it with tensorflow-text's SentencePiece op. LiteRT has none of them: besides
gathering and slicing strings, it has tensorflow-text's `ByteSplitWithOffsets`
(a string to its bytes) and `NgramsStringJoin` (strings joined). So the LiteRT
translator turns each sentence into its bytes and does the rest on numbers,
step by step as the `Translator` does (`Translator.normalized`, then
SentencePiece, then `Tokenizer.detokenize`), giving the same ids and texts:

1. bytes -> Unicode characters, each invalid UTF-8 sequence (its maximal
   subpart, as TensorFlow's `unicode_transcode` and Python replace them)
   becoming U+FFFD;
2. the `Translator`'s normalization: a leading byte-order mark dropped, runs
   of spaces and tabs made one space, whitespace at both ends dropped
   (`keras_transformer.data.text.normalize_in_graph`);
3. SentencePiece's: "▁" in front of a non-empty sentence and for every space;
4. characters -> pieces, a character without a piece to the pieces of its
   UTF-8 bytes (byte fallback), or the unknown piece;
5. SentencePiece's BPE: in each word, the pair of adjacent pieces whose
   merged piece scores highest is merged, the leftmost of equals first, until
   no pair makes a piece. The words are merged side by side in one
   `while_loop`, one merge per word per step;
6. cut to `max_input_length - 1` pieces, then the end token.

Decoding keeps the tokens before the first end token (no padding, no start
token), turns them into the texts SentencePiece's decoder writes (a byte
piece's byte where its run of byte pieces holds a valid UTF-8 character at
that place, U+FFFD for each other byte; the first word without its "▁") and
joins them with tensorflow-text's `NgramsStringJoin`. (tensorflow-text's
`FastSentencepieceDetokenize` would join them too, but its LiteRT kernel
leaves its output one string long whatever the batch, and writes C strings.)

Shapes: N sentences, W bytes, U characters, M pieces (padded with -1).
"""

import tensorflow as tf

from keras_transformer.inference.litert_vocab import BYTE
from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

# Code points that `normalize_in_graph` makes one space inside a sentence: [ \t\r\f\v].
INNER_SPACES = (0x20, 0x09, 0x0D, 0x0C, 0x0B)
# ... and drops at either end: [\t-\r\x1c-\x1f\x85\p{Z}].
EDGE_SPACES = (
    *range(0x09, 0x0E),
    *range(0x1C, 0x20),
    0x85,
    0x20,
    0xA0,
    0x1680,
    *range(0x2000, 0x200B),
    0x2028,
    0x2029,
    0x202F,
    0x205F,
    0x3000,
)
BYTE_ORDER_MARK = 0xFEFF
SPACE_MARK = 0x2581
REPLACEMENT = 0xFFFD


def pieces(strings, tables, max_input_bytes=None):
    """Sentences `[N]` -> `(pieces int32 [N + 1, M], -1 padded; blank bool [N + 1])`, the `Translator`'s subwords.

    The pieces are `Tokenizer.tokenize(Translator.normalized(strings))`, from `tables` (a `SubwordTables`),
    and a blank last row (see `byte_grid`). With `max_input_bytes`, each sentence is first cut as
    `Translator.bounded` cuts it.

    `blank`: the sentence is empty once normalized (the `Translator` answers it with "" and score 0).
    """
    grid = byte_grid(strings)
    if max_input_bytes:
        chars = bounded_characters(grid, max_input_bytes)
    else:
        chars = utf8_characters(grid)
    chars = normalized_characters(chars)  # [N + 1, U]
    initial = character_pieces(with_space_marks(chars), tables)
    return bpe_merge(initial, tables), tf.equal(row_lengths(chars), 0)


def source_ids(strings, tables, max_input_length, max_input_bytes=None):
    """Sentences `[N]` -> `(source ids int32 [N + 1, S], blank bool [N + 1])`, as `Translator.source_ids` gives them.

    The last row is a blank sentence's (see `byte_grid`). `max_input_bytes`: see `pieces`.
    """
    merged, blank = pieces(strings, tables, max_input_bytes)
    merged = tf.pad(merged[:, : max_input_length - 1], [[0, 0], [0, 1]], constant_values=-1)
    lengths = row_lengths(merged)
    columns = tf.range(tf.shape(merged)[1])[None, :]
    ids = tf.where(columns == lengths[:, None], EOS_ID, tf.where(merged < 0, PAD_ID, merged))
    return ids[:, : tf.reduce_max(lengths) + 1], blank


def detokenize(token_ids, tables, max_length):
    """Output ids `[N, L]` (N > 0) -> texts `[N]`, as `Tokenizer.detokenize` gives them.

    `max_length`: the most tokens a row holds (L at most), a Python int: the
    texts are joined by tensorflow-text's `NgramsStringJoin` over a window of
    that many atoms.
    """
    import tensorflow_text as tf_text

    token_ids = tf.cast(token_ids, tf.int32)
    before_end = tf.equal(tf.cumsum(tf.cast(tf.equal(token_ids, EOS_ID), tf.int32), axis=1), 0)
    keep = before_end & tf.not_equal(token_ids, PAD_ID) & tf.not_equal(token_ids, BOS_ID)
    tokens = compact(token_ids, keep, -1)  # [N, L']
    known = tokens >= 0
    safe = tf.maximum(tokens, 0)
    is_byte = known & tf.equal(tf.gather(tf.constant(tables.piece_types), safe), BYTE)
    values = tf.where(is_byte, tf.gather(tf.constant(_byte_values(tables)), safe), -1)
    byte_atoms = tf.where(
        _in_valid_character(values), tables.raw_byte_offset + tf.maximum(values, 0), tables.replacement_atom
    )
    # SentencePiece drops the "▁" of the first piece that writes text (a lone "▁" writes none).
    writes = known & tf.not_equal(tokens, tables.space_id)
    first = tf.equal(tf.cumsum(tf.cast(writes, tf.int32), axis=1, exclusive=True), 0)
    stripped = first & tf.gather(tf.constant(tables.starts_word), safe)
    atoms = tf.where(is_byte, byte_atoms, tf.where(stripped, tables.stripped_offset + safe, safe))
    atoms = tf.where(known, atoms, PAD_ID)  # the pad piece writes nothing
    # A fixed window of atoms per row (the join's width is an attribute), each its text.
    atoms = tf.reshape(tf.pad(atoms, [[0, 0], [0, max_length]])[:, :max_length], [-1, max_length])
    texts = tf.gather(tf.constant(tables.atom_texts(), tf.string), atoms)
    joined = tf_text.ngrams(texts, max_length, reduction_type=tf_text.Reduction.STRING_JOIN, string_separator="")
    return tf.reshape(joined, [-1])


# Bytes and characters -----------------------------------------------------------------


def byte_grid(strings):
    """Strings `[N]` -> their bytes, int32 `[N + 1, W]`, -1 past each string's end (`ByteSplitWithOffsets`).

    The last row is an empty string's, and W is at least 1: some of LiteRT's
    kernels (padding, scattering) fail on tensors without elements, which an
    empty batch, or a batch of empty strings, would otherwise give. The
    callers drop that row at the end.
    """
    import tensorflow_text as tf_text

    split = tf_text.ByteSplitter().split(strings)
    splits = tf.cast(split.row_splits, tf.int32)
    splits = tf.concat([splits, splits[-1:]], axis=0)
    values = tf.concat([tf.cast(split.flat_values, tf.int32), [-1]], axis=0)
    lengths = splits[1:] - splits[:-1]
    columns = tf.range(tf.maximum(tf.reduce_max(lengths), 1))[None, :]
    inside = columns < lengths[:, None]
    return tf.gather(values, tf.where(inside, splits[:-1, None] + columns, tf.size(values) - 1))


def utf8_characters(grid):
    """Bytes `[N, W]` -> code points `[N, U]`, -1 padded; each maximal ill-formed subpart -> U+FFFD.

    A character starts at every byte that is no continuation byte (80-BF),
    and at a continuation byte that the character before does not reach.
    """
    b0, b1, b2, b3 = (_shift(grid, k) for k in range(4))
    cont1, cont2, cont3 = (_between(b, 0x80, 0xBF) for b in (b1, b2, b3))
    two = _between(b0, 0xC2, 0xDF)
    three, four = _between(b0, 0xE0, 0xEF), _between(b0, 0xF0, 0xF4)
    # The second byte's range after E0, ED, F0 and F4 is narrower (Unicode Table 3-7).
    low = tf.where(tf.equal(b0, 0xE0), 0xA0, tf.where(tf.equal(b0, 0xF0), 0x90, 0x80))
    high = tf.where(tf.equal(b0, 0xED), 0x9F, tf.where(tf.equal(b0, 0xF4), 0x8F, 0xBF))
    second = (three | four) & (b1 >= low) & (b1 <= high)
    third = second & cont2
    length = tf.where(two & cont1, 2, 1)
    length = tf.where(three, 1 + tf.cast(second, tf.int32) + tf.cast(third, tf.int32), length)
    length = tf.where(
        four, 1 + tf.cast(second, tf.int32) + tf.cast(third, tf.int32) + tf.cast(third & cont3, tf.int32), length
    )
    valid = _between(b0, 0, 0x7F) | (two & cont1) | (three & third) | (four & third & cont3)
    low6 = [b - 0x80 for b in (b1, b2, b3)]
    code = tf.where(two, (b0 - 0xC0) * 64 + low6[0], b0)
    code = tf.where(three, (b0 - 0xE0) * 4096 + low6[0] * 64 + low6[1], code)
    code = tf.where(four, (b0 - 0xF0) * 262144 + low6[0] * 4096 + low6[1] * 64 + low6[2], code)
    lead = (b0 >= 0) & ~_between(b0, 0x80, 0xBF)
    covered = tf.zeros_like(lead)
    for distance in (1, 2, 3):
        covered |= _shift(tf.where(lead, length, 0), -distance, 0) > distance
    starts = (b0 >= 0) & ~covered
    return compact(tf.where(valid, code, REPLACEMENT), starts, -1)


def bounded_characters(grid, max_bytes):
    """`utf8_characters` of each row's first `max_bytes` bytes; a row that was longer loses its trailing U+FFFDs.

    As `Translator.bounded` cuts a sentence: a character cut in two decodes to U+FFFD, and every U+FFFD at
    the end of a cut sentence is dropped.
    """
    cut = row_lengths(grid) > max_bytes
    chars = utf8_characters(grid[:, :max_bytes])
    other = tf.cast((chars >= 0) & tf.not_equal(chars, REPLACEMENT), tf.int32)
    trailing = tf.equal(tf.cumsum(other, axis=1, reverse=True), 0)
    return compact(chars, (chars >= 0) & ~(cut[:, None] & trailing), -1)


def normalized_characters(chars):
    """Code points `[N, U]` as `Translator.normalized` leaves them (see the module docstring), -1 padded."""
    present = chars >= 0
    columns = tf.range(tf.shape(chars)[1])[None, :]
    keep = present & ~((columns == 0) & tf.equal(chars, BYTE_ORDER_MARK))
    inner = _member(chars, INNER_SPACES)
    keep &= ~(inner & _shift(inner, -1, False))
    chars = tf.where(inner, 0x20, chars)
    text = keep & ~_member(chars, EDGE_SPACES)  # kept characters that are no edge whitespace
    counts = tf.cast(text, tf.int32)
    keep &= (tf.cumsum(counts, axis=1) > 0) & (tf.cumsum(counts, axis=1, reverse=True) > 0)
    return compact(chars, keep, -1)


def with_space_marks(chars):
    """SentencePiece's normalization: "▁" before a non-empty text and in place of each space, none at the end.

    SentencePiece drops trailing "▁" once spaces are marks, so a "▁" written in the text goes too.
    """
    marks = tf.where(row_lengths(chars) > 0, SPACE_MARK, -1)[:, None]
    chars = tf.concat([marks, tf.where(tf.equal(chars, 0x20), SPACE_MARK, chars)], axis=1)
    text = tf.cast((chars >= 0) & tf.not_equal(chars, SPACE_MARK), tf.int32)
    return compact(chars, (chars >= 0) & (tf.cumsum(text, axis=1, reverse=True) > 0), -1)


def character_pieces(chars, tables):
    """Code points `[N, U]` -> the initial pieces `[N, M]`: each character's piece, else its byte pieces or unknown."""
    found, index = sorted_lookup(tables.chars, chars)
    known = found & (chars >= 0)
    char_ids = tf.gather(tf.constant(tables.char_ids), index)
    unknown = ~found & (chars >= 0)
    if tables.byte_ids is None:
        # SentencePiece writes a run of unknown characters as one unknown piece.
        slots = tf.where(known, char_ids, tf.where(unknown & ~_shift(unknown, -1, False), UNK_ID, -1))
        return compact(slots, slots >= 0, -1)
    byte_values, byte_count = _utf8_bytes(tf.maximum(chars, 0))  # [N, U, 4], [N, U]
    byte_pieces = tf.gather(tf.constant(tables.byte_ids), byte_values)
    used = tf.expand_dims(unknown, -1) & (tf.range(4) < tf.expand_dims(byte_count, -1))
    slots = tf.where(used, byte_pieces, -1)
    slots = tf.concat([tf.expand_dims(tf.where(known, char_ids, slots[:, :, 0]), -1), slots[:, :, 1:]], axis=2)
    # No -1 in the shape: LiteRT infers it by a division, by zero for an empty batch.
    slots = tf.reshape(slots, [tf.shape(chars)[0], 4 * tf.shape(chars)[1]])
    return compact(slots, slots >= 0, -1)


# BPE ------------------------------------------------------------------------------------


def bpe_merge(initial, tables):
    """SentencePiece's BPE on initial pieces `[N, M]`: merged pieces `[N, M']`, -1 padded."""

    def body(pieces, _):
        rank, merged = _pair_merges(pieces, tables)  # [N, M-1]
        mergeable = rank < _NO_MERGE
        # Each word's best pair (lowest rank), the leftmost of equals: one merge per word.
        batch, width = tf.shape(pieces)[0], tf.shape(pieces)[1]
        words = tf.cumsum(tf.cast(tf.gather(tf.constant(tables.starts_word), tf.maximum(pieces, 0)), tf.int32), axis=1)
        segment = (tf.range(batch)[:, None] * (width + 1) + words)[:, :-1]  # the left piece's word
        count = batch * (width + 1)
        best = tf.gather(tf.math.unsorted_segment_min(rank, segment, count), segment)
        candidate = mergeable & tf.equal(rank, best)
        columns = tf.broadcast_to(tf.range(tf.maximum(width - 1, 0))[None, :], tf.shape(rank))
        leftmost = tf.gather(
            tf.math.unsorted_segment_min(tf.where(candidate, columns, _NO_MERGE), segment, count), segment
        )
        at = candidate & tf.equal(columns, leftmost)  # [N, M-1]: merge piece j with j + 1
        no_column = tf.zeros([batch, 1], tf.bool)
        left = tf.concat([at, no_column], axis=1)
        right = tf.concat([no_column, at], axis=1)
        merged = tf.concat([merged, tf.fill([batch, 1], -1)], axis=1)
        pieces = tf.where(left, merged, pieces)
        return compact(pieces, ~right & (pieces >= 0), -1, min_width=2), tf.reduce_any(mergeable)

    merged, _ = tf.while_loop(
        lambda pieces, more: more,
        body,
        (compact(initial, initial >= 0, -1, min_width=2), tf.constant(True)),  # at least one pair
        shape_invariants=(tf.TensorShape([None, None]), tf.TensorShape([])),
    )
    return merged


_NO_MERGE = 2**30


def _pair_merges(pieces, tables):
    """For each pair of adjacent pieces `[N, M-1]`: the rank of the piece they make (`_NO_MERGE`: none) and its id."""
    left, right = pieces[:, :-1], pieces[:, 1:]
    key = tf.cast(left, tf.int64) * tables.vocab_size + tf.cast(right, tf.int64)
    found, index = sorted_lookup(tables.merge_keys, key)
    found &= (left >= 0) & (right >= 0)
    rank = tf.where(found, tf.gather(tf.constant(tables.merge_ranks), index), _NO_MERGE)
    return rank, tf.gather(tf.constant(tables.merge_ids), index)


# Helpers ------------------------------------------------------------------------------


def sorted_lookup(table, values):
    """`(found, index)`: where each of `values` is in the sorted 1-D constant `table` (binary search, unrolled)."""
    table = tf.constant(table)
    values = tf.cast(values, table.dtype)
    size = int(table.shape[0])
    if size == 0:
        return tf.zeros_like(values, tf.bool), tf.zeros_like(values, tf.int32)
    low, high = tf.zeros_like(values, tf.int32), tf.fill(tf.shape(values), size)
    for _ in range(size.bit_length()):
        middle = (low + high) // 2
        below = tf.gather(table, tf.minimum(middle, size - 1)) < values
        low, high = tf.where(below, middle + 1, low), tf.where(below, high, middle)
    index = tf.minimum(low, size - 1)
    return tf.equal(tf.gather(table, index), values), index


def compact(values, keep, fill, min_width=1):
    """`values [N, W]` with each row's kept entries moved to its front, in order; then `fill`.

    The result is cut to the longest row, but keeps at least `min_width`
    columns (see `byte_grid`).
    """
    counts = tf.reduce_sum(tf.cast(keep, tf.int32), axis=1)
    width = tf.maximum(tf.reduce_max(counts), min_width)
    target = tf.where(keep, tf.cumsum(tf.cast(keep, tf.int32), axis=1, exclusive=True), width)  # dropped: past the end
    rows = tf.broadcast_to(tf.range(tf.shape(values)[0])[:, None], tf.shape(values))
    indices = tf.stack([rows, target], axis=-1)
    shape = tf.stack([tf.shape(values)[0], width + 1])
    moved = tf.scatter_nd(indices, tf.where(keep, values - fill, 0), shape)
    return (moved + fill)[:, :width]


def row_lengths(padded):
    """The entries of each row of a -1 padded `[N, W]`."""
    return tf.reduce_sum(tf.cast(padded >= 0, tf.int32), axis=1)


def _shift(grid, k, fill=-1):
    """`grid[:, p + k]` at each p (`fill` outside the row); k < 0 looks back."""
    if grid.dtype == tf.bool:
        return tf.cast(_shift(tf.cast(grid, tf.int32), k, int(fill)), tf.bool)
    width = tf.shape(grid)[1]
    if k >= 0:
        return tf.pad(grid, [[0, 0], [0, k]], constant_values=fill)[:, k : k + width]
    return tf.pad(grid, [[0, 0], [-k, 0]], constant_values=fill)[:, :width]


def _between(values, low, high):
    return (values >= low) & (values <= high)


def _member(values, members):
    return tf.reduce_any(tf.equal(tf.expand_dims(values, -1), tf.constant(members, tf.int32)), axis=-1)


def _utf8_bytes(code):
    """Code points `[...]` -> their UTF-8 bytes `[..., 4]` (unused ones 0) and byte counts."""
    count = 1 + tf.cast(code >= 0x80, tf.int32) + tf.cast(code >= 0x800, tf.int32) + tf.cast(code >= 0x10000, tf.int32)
    six = [code // 64**k % 64 for k in range(4)]  # 6-bit groups, lowest first
    first = tf.where(
        count == 1,
        code,
        tf.where(count == 2, 0xC0 + code // 64, tf.where(count == 3, 0xE0 + code // 4096, 0xF0 + code // 262144)),
    )
    # The continuation bytes, most significant first, for each count.
    tail = [
        tf.where(count == 2, 0x80 + six[0], tf.where(count == 3, 0x80 + six[1], 0x80 + six[2])),
        tf.where(count == 3, 0x80 + six[0], 0x80 + six[1]),
        0x80 + six[0],
    ]
    tail = [tf.where(count > k + 1, byte, 0) for k, byte in enumerate(tail)]
    return tf.stack([first, *tail], axis=-1), count


def _in_valid_character(values):
    """Bytes of byte pieces `[N, L]` (-1 elsewhere): whether each is part of a valid UTF-8 character of its run.

    SentencePiece's decoder reads each run of byte pieces as UTF-8 and writes U+FFFD for every byte where no
    valid character starts and that no valid character before it covers (one per byte, not per subpart).
    """
    b0, b1, b2, b3 = (_shift(values, k) for k in range(4))
    cont1, cont2, cont3 = (_between(b, 0x80, 0xBF) for b in (b1, b2, b3))
    low = tf.where(tf.equal(b0, 0xE0), 0xA0, tf.where(tf.equal(b0, 0xF0), 0x90, 0x80))
    high = tf.where(tf.equal(b0, 0xED), 0x9F, tf.where(tf.equal(b0, 0xF4), 0x8F, 0xBF))
    second = (b1 >= low) & (b1 <= high)
    length = tf.where(_between(b0, 0, 0x7F), 1, 0)
    length = tf.where(_between(b0, 0xC2, 0xDF) & cont1, 2, length)
    length = tf.where(_between(b0, 0xE0, 0xEF) & second & cont2, 3, length)
    length = tf.where(_between(b0, 0xF0, 0xF4) & second & cont2 & cont3, 4, length)
    inside = length > 0
    for distance in (1, 2, 3):
        inside |= _shift(length, -distance, 0) > distance
    return inside & (values >= 0)


def _byte_values(tables):
    """int32 `[V]`: the byte of each byte piece, -1 for the others."""
    import numpy as np

    values = np.full([tables.vocab_size], -1, np.int32)
    if tables.byte_ids is not None:
        values[tables.byte_ids] = np.arange(256, dtype=np.int32)
    return values
