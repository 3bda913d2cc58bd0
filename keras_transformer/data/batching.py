"""Token-budget batches for the Transformer (Vaswani et al., 2017, §5.1).

"Sentence pairs were batched together by approximate sequence length. Each
training batch contained a set of sentence pairs containing approximately
25000 source tokens and 25000 target tokens." `make_batches` reproduces that
scheme with `tf.data`: in-graph SentencePiece tokenization, special tokens, a
maximum length, length bucketing and batching by a *token budget* (the
tensor2tensor/fairseq way), padding each batch to its bucket boundary.

Output of `make_batches`, the Keras `(inputs, targets)` convention:

    ((source_ids, target_input_ids), target_output_ids)    # int32, [batch, length]

    source_ids        = x + [EOS]
    target_input_ids  = [BOS] + y      (decoder input, "shifted right", §3.1)
    target_output_ids = y + [EOS]      (labels)

with padding id 0 (`special_ids.PAD_ID`) everywhere, so masks are `ids != 0`
(a partial batch split over several replicas may end in rows of padding only).
The source gets an EOS but no BOS: the encoder needs no start token, and the
EOS marks the end of the sentence for the attention over it (the convention of
tensor2tensor and fairseq).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence

import tensorflow as tf

from keras_transformer.special_ids import BOS_ID, EOS_ID, PAD_ID

logger = logging.getLogger(__name__)

# make_batches puts a dataset of known size up to this many pairs into one pool.
MAX_DEFAULT_POOL_SIZE = 1_000_000

# The most bytes one token covers for SentencePiece's defaults (`Tokenizer.max_bytes_per_token`
# gives a model's own): a piece has at most 16 characters (`max_sentencepiece_length`) of at most
# 4 UTF-8 bytes each. Assumed for a tokenizer that does not say.
MAX_BYTES_PER_TOKEN = 64


def max_bytes_per_token(tokenizer) -> int | None:
    """The tokenizer's `max_bytes_per_token`, or `MAX_BYTES_PER_TOKEN` if it has none (None: no bound)."""
    return getattr(tokenizer, "max_bytes_per_token", MAX_BYTES_PER_TOKEN)


def within_byte_limit(
    sources: tf.Tensor, targets: tf.Tensor, max_length: int, bytes_per_token: int | None = MAX_BYTES_PER_TOKEN
) -> tf.Tensor:
    """Which pairs (rank-1 `tf.string`) may fit in `max_length` tokens: neither side over
    `bytes_per_token * max_length` bytes (all of them if `bytes_per_token` is None).

    With the tokenizer's own bound (`max_bytes_per_token`), the pairs it
    rejects would be dropped after tokenization anyway; dropped before it, one
    over-long line (a stray megabyte) costs no tokenization and no ragged
    tensors, whose memory grows with the line's length.

    Example:
        >>> within_byte_limit(tf.constant(["a b", "x" * 200]), tf.constant(["c", "d"]), max_length=3).numpy()
        array([ True, False])
    """
    if bytes_per_token is None:
        return tf.ones_like(sources, dtype=tf.bool)
    limit = bytes_per_token * max_length
    return tf.logical_and(tf.strings.length(sources) <= limit, tf.strings.length(targets) <= limit)


def default_bucket_boundaries(
    max_length: int, min_length: int = 8, growth: float = 1.1, multiple: int = 8
) -> list[int]:
    """Geometric bucket boundaries, rounded up to a multiple of `multiple`.

    Each boundary is at least `growth` times the previous one (tensor2tensor
    uses the same 1.1 growth) and a multiple of `multiple` (friendly to
    matrix-unit tile sizes, and few shapes for XLA to compile); the last one
    is `max_length`. For `max_length=256`: 8, 16, ..., 88, 104, 120, 136,
    152, 168, 192, 216, 240, 256 (20 buckets). `multiple=1` gives short
    sentences, most of a corpus, buckets one or two tokens apart: 8, 9, 10,
    11, 13, 15, ..., 251, 256 (34 buckets), which pads far less, with more
    batch shapes (`benchmarks/input_pipeline.py`; benchmarks/README.md has
    what it did to the demo's training).

    Args:
        max_length: longest sequence length (including special tokens).
        min_length: first boundary (before rounding).
        growth: ratio between consecutive boundaries (> 1).
        multiple: boundaries are rounded up to a multiple of this.

    Returns:
        the increasing boundaries, the last one `max_length`.

    Example:
        >>> default_bucket_boundaries(64)
        [8, 16, 24, 32, 40, 48, 56, 64]
    """
    if max_length < 1 or min_length < 1 or growth <= 1 or multiple < 1:
        raise ValueError("need max_length >= 1, min_length >= 1, growth > 1, multiple >= 1")
    boundaries: list[int] = []
    x = float(min_length)
    while not boundaries or boundaries[-1] < max_length:
        b = min(int(math.ceil(x / multiple)) * multiple, max_length)
        boundaries.append(b)
        x = max(b * growth, b + 1)
    return boundaries


def bucket_batch_sizes(boundaries: Sequence[int], batch_tokens: int, num_replicas: int = 1) -> list[int]:
    """Sentences per batch for each bucket: `batch_tokens // boundary`,
    rounded down to a multiple of `num_replicas` (§5.1's token budget per batch).

    Args:
        boundaries: the bucket boundaries (padded lengths).
        batch_tokens: token budget per batch and side, padding included.
        num_replicas: every batch size is a multiple of it, so that the batch
            splits evenly over the replicas.

    Returns:
        one batch size per boundary.

    Raises:
        ValueError: if a bucket cannot hold `num_replicas` sequences in budget.

    Example:
        >>> bucket_batch_sizes([8, 16, 32], batch_tokens=256, num_replicas=2)
        [32, 16, 8]
    """
    sizes = []
    for b in boundaries:
        size = (batch_tokens // b) // num_replicas * num_replicas
        if size < num_replicas or size == 0:
            raise ValueError(
                f"batch_tokens={batch_tokens} is too small: a batch of bucket length {b} "
                f"must hold at least num_replicas={num_replicas} sequences "
                f"(need batch_tokens >= {b * num_replicas})"
            )
        sizes.append(size)
    return sizes


def checked_bucket_boundaries(boundaries: Sequence[int], max_length: int) -> list[int]:
    """`boundaries` as `make_batches` uses them: checked, and cut at `max_length`."""
    boundaries = [int(b) for b in boundaries]
    if not boundaries or any(b < 1 for b in boundaries) or any(a >= b for a, b in zip(boundaries, boundaries[1:])):
        raise ValueError(f"bucket_boundaries must be increasing positive ints, got {boundaries}")
    if boundaries[-1] < max_length:
        raise ValueError(f"The last bucket boundary ({boundaries[-1]}) must be >= max_length ({max_length})")
    # No batch is padded past max_length (a learned position table ends there): the first boundary
    # at or beyond it becomes max_length, and later ones could hold no pair.
    shorter = [b for b in boundaries if b < max_length]
    return shorter + [max_length]


def whole_batches(counts: Sequence[int], batch_sizes: Sequence[int]) -> int:
    """Batches `make_batches(..., drop_remainder=True)` cuts from one pool with `counts[k]` pairs in bucket k.

    A bucket's pairs left over after its whole batches join the next longer
    bucket (padded to its boundary), so a bucket with fewer pairs than one
    batch is not left out of every pass; only the longest bucket's leftovers
    are dropped.

    Example:
        >>> whole_batches([5, 3, 1], [4, 2, 2])  # 1 of 4; the leftover pair makes 2 of 2; 1 pair dropped
        3
    """
    total, carried = 0, 0
    for count, size in zip(counts, batch_sizes):
        total += (int(count) + carried) // size
        carried = (int(count) + carried) % size
    return total


def make_batches(
    dataset: tf.data.Dataset,
    tokenizer,
    *,
    batch_tokens: int = 4096,
    max_length: int = 256,
    bucket_boundaries: Sequence[int] | None = None,
    shuffle: bool = True,
    seed: int | None = 0,
    num_replicas: int | None = None,
    truncate: bool = False,
    repeat: bool = False,
    drop_remainder: bool = False,
    shuffle_buffer_size: int | None = None,
    pool_size: int | None = None,
    sampling_alpha: float = 0.0,
) -> tf.data.Dataset:
    """Tokenizes, buckets by length and batches by a token budget (§5.1).

    Every batch is `[batch_size, boundary]` on each side, where `boundary`
    is the bucket boundary of its pairs (the smallest boundary >= max(source
    length, target length), lengths counted with the added EOS/BOS) and
    `batch_size = batch_tokens // boundary` rounded down to a multiple of
    `num_replicas` (the last, partial batch of a bucket may hold fewer
    pairs). So each side of a batch has at most `batch_tokens` tokens
    *including padding*,
    and tensor shapes come from a small set (one length per bucket), which
    limits retracing. The paper's batches held ~25000 source + 25000 target
    tokens; on one 8-GPU machine that is `batch_tokens ~= 25000` with
    `num_replicas=8`.

    Pipeline: shuffle sentence pairs (seeded, reshuffled each epoch) -> repeat
    (optional) -> drop pairs too long in bytes to fit (`within_byte_limit`;
    not with `truncate`) -> tokenize in chunks of 1024 with parallel maps ->
    add EOS/BOS -> drop or truncate over-long pairs -> gather *pools* of `pool_size`
    pairs and, per pool, sort them into buckets and cut each bucket into
    batches (vectorized, like fairseq/tensor2tensor's sort-then-batch; far
    cheaper than per-sentence `group_by_window`) -> pad each batch to its
    boundary -> prefetch. Deterministic for a given `seed` (unless
    `sampling_alpha` samples segmentations).

    Batches come out in the order `group_by_window` would give: a batch is
    emitted at the position of its last pair in the (shuffled) input, so
    lengths interleave and the batch order is as random as the pair order.
    Each bucket of a pool ends with at most one partial batch. With
    `drop_remainder` there are only whole batches: a bucket's leftover pairs
    join the next longer bucket, and only the longest bucket's leftovers are
    dropped (other pairs each pass). By default a dataset of known size up to
    `MAX_DEFAULT_POOL_SIZE` (1M) pairs is one pool, so with
    `drop_remainder=True` an epoch has exactly `whole_batches(n, sizes)`
    batches (`n[k]` pairs in bucket `k`, `sizes` from
    `bucket_batch_sizes`), whatever the order of the pairs.

    Args:
        dataset: `(source_text, target_text)` scalar `tf.string` pairs.
        tokenizer: object with `tokenize(strings) -> RaggedTensor`, e.g.
            `keras_transformer.data.tokenizer.Tokenizer`.
        batch_tokens: GLOBAL token budget per batch and side, padding included
            (split across replicas by `tf.distribute`).
        max_length: longest allowed sequence, counting the EOS (source) or the
            BOS/EOS (target).
        bucket_boundaries: increasing bucket lengths, last one >= max_length
            (boundaries past max_length are cut to it); default
            `default_bucket_boundaries(max_length)`. Each batch is padded to
            its boundary.
        shuffle: shuffle the pairs before bucketing (`shuffle=False` keeps the
            input order; batches still mix lengths, see above).
        seed: shuffle seed (None: nondeterministic).
        num_replicas: replicas the global batch is split over; every batch size
            is a multiple of it. None: `tf.distribute.get_strategy()
            .num_replicas_in_sync` (so call this inside `strategy.scope()`).
        truncate: False (default): drop pairs with a side longer than
            `max_length`. True: cut them to `max_length` (the source keeps its
            EOS; the target keeps BOS in the input and ends in EOS in the output).
        repeat: repeat the data forever (before pooling, so pools run across
            epoch boundaries).
        drop_remainder: only whole batches, so every batch of a bucket has the
            same size: each bucket's leftover pairs in a pool join the next
            longer bucket, the longest bucket's are dropped. If False, every
            pair is kept, and with `num_replicas > 1` a partial batch is filled
            up to a multiple of `num_replicas` with empty rows (padding only):
            they hold no token, so they change no batch's loss or accuracy
            (Keras still counts them in the batch size it weights a mean over
            batches by).
        shuffle_buffer_size: sentence-pair shuffle buffer; default: the dataset
            size if known, capped at 100000.
        pool_size: pairs bucketed together; larger pools mean fewer partial
            batches but more memory and a longer wait for the first batch.
            Default: the dataset size if known and <= `MAX_DEFAULT_POOL_SIZE`
            (one pool per epoch), else `max(32768, 4 * batch_tokens)`.
            Rounded up to a multiple of 1024 if larger.
        sampling_alpha: above 0, each pass segments every sentence anew at random
            (`Tokenizer.tokenize`'s `sampling_alpha`; not reproducible by `seed`).

    Returns:
        `tf.data.Dataset` of `((source_ids, target_input_ids), target_output_ids)`,
        int32 `[batch, boundary]` tensors padded with 0.
    """
    if num_replicas is None:
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 (BOS/EOS + one token), got {max_length}")
    if bucket_boundaries is None:
        bucket_boundaries = default_bucket_boundaries(max_length)
    boundaries = checked_bucket_boundaries(bucket_boundaries, max_length)
    batch_sizes = bucket_batch_sizes(boundaries, batch_tokens, num_replicas)
    size = _known_size(dataset)
    if pool_size is None:
        pool_size = size if 0 < size <= MAX_DEFAULT_POOL_SIZE else max(32768, 4 * batch_tokens)
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    chunk = min(1024, pool_size)  # pairs per tokenizer call
    pool_chunks = -(-pool_size // chunk)

    if shuffle:
        if shuffle_buffer_size is None:
            shuffle_buffer_size = min(size, 100_000) if size > 0 else 100_000
        dataset = dataset.shuffle(shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()

    tokenize_chunk = _chunk_tokenizer(tokenizer, max_length, truncate, sampling_alpha)
    dataset = dataset.batch(chunk).map(tokenize_chunk, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.batch(pool_chunks)  # -> [chunks, pairs, tokens] ragged pools
    to_batches = _PoolBatcher(boundaries, batch_sizes, drop_remainder)
    dataset = dataset.map(to_batches, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.unbatch()  # -> one batch (ragged [batch, tokens]) per element

    def pad_to_boundary(src, tgt_in, tgt_out, boundary):
        # A partial batch gets empty rows (padding only) up to a multiple of the replicas, so that it splits
        # evenly over them; padding carries no loss, accuracy or token count.
        rows = -(-src.nrows() // num_replicas) * num_replicas
        shape = tf.stack([rows, boundary])
        src, tgt_in, tgt_out = (r.to_tensor(default_value=PAD_ID, shape=shape) for r in (src, tgt_in, tgt_out))
        return (src, tgt_in), tgt_out

    dataset = dataset.map(pad_to_boundary, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _chunk_tokenizer(tokenizer, max_length, truncate, sampling_alpha):
    """The `tf.data` map of `make_batches` from a chunk of text pairs to ragged ids with EOS/BOS.

    Returns a function of `(sources, targets)` (rank-1 `tf.string`) giving
    `(source_ids, target_input_ids, target_output_ids)` ragged tensors, the
    pairs with a side longer than `max_length` left out (or, with
    `truncate`, cut to it first).
    """
    tokenize = (
        functools.partial(tokenizer.tokenize, sampling_alpha=sampling_alpha) if sampling_alpha else (tokenizer.tokenize)
    )

    bytes_per_token = max_bytes_per_token(tokenizer)

    def tokenize_chunk(sources, targets):
        if not truncate:  # pairs too long in bytes are dropped before they cost memory
            fits_bytes = within_byte_limit(sources, targets, max_length, bytes_per_token)
            sources, targets = tf.boolean_mask(sources, fits_bytes), tf.boolean_mask(targets, fits_bytes)
        # One SentencePiece call per chunk is much faster than one per sentence.
        src, tgt = tokenize(sources), tokenize(targets)
        if truncate:
            src = src[:, : max_length - 1]
            tgt = tgt[:, : max_length - 1]
        n = tf.shape(sources, out_type=tf.int64)[0]
        eos = tf.fill([n, 1], tf.constant(EOS_ID, src.dtype))
        bos = tf.fill([n, 1], tf.constant(BOS_ID, tgt.dtype))
        src = tf.concat([src, eos], axis=1)
        tgt_in = tf.concat([bos, tgt], axis=1)
        tgt_out = tf.concat([tgt, eos], axis=1)
        # Lengths with special tokens; the target length counts one of BOS/EOS.
        fits = tf.logical_and(src.row_lengths() <= max_length, tgt_in.row_lengths() <= max_length)
        return (
            tf.ragged.boolean_mask(src, fits),
            tf.ragged.boolean_mask(tgt_in, fits),
            tf.ragged.boolean_mask(tgt_out, fits),
        )

    return tokenize_chunk


def _known_size(dataset: tf.data.Dataset) -> int:
    """Number of elements if known when building the pipeline, else -1.

    Inside a traced function (e.g. `flat_map`) the cardinality is a symbolic
    tensor and usually unknown.
    """
    cardinality = tf.get_static_value(dataset.cardinality())
    return -1 if cardinality is None else int(cardinality)


class _PoolBatcher:
    """Cuts a pool of tokenized pairs into bucketed, token-budget batches.

    Vectorized: one stable sort by bucket, then each bucket's pairs are split
    into consecutive batches of its batch size. Returns 3-D ragged tensors
    `[batches, batch, tokens]` and each batch's boundary.
    """

    def __init__(self, boundaries, batch_sizes, drop_remainder):
        self.boundaries = tf.constant(boundaries, tf.int64)
        self.batch_sizes = tf.constant(batch_sizes, tf.int64)
        self.num_buckets = len(boundaries)
        self.drop_remainder = drop_remainder

    def _carry_leftovers_up(self, bucket):
        """Moves the pairs of each bucket beyond its whole batches (the last ones in pool order) to the
        next longer bucket, from the shortest up (`whole_batches`)."""
        for k in range(self.num_buckets - 1):
            in_bucket = tf.equal(bucket, k)
            rank = tf.cumsum(tf.cast(in_bucket, tf.int64)) - 1  # among bucket k's pairs, in pool order
            count = tf.reduce_sum(tf.cast(in_bucket, tf.int64))
            whole = count // self.batch_sizes[k] * self.batch_sizes[k]
            bucket = tf.where(in_bucket & (rank >= whole), tf.constant(k + 1, bucket.dtype), bucket)
        return bucket

    def __call__(self, *pool):
        # [chunks, pairs, tokens] -> [pairs, tokens]
        src, tgt_in, tgt_out = (x.merge_dims(0, 1) for x in pool)
        lengths = tf.maximum(src.row_lengths(), tgt_in.row_lengths())
        # Bucket = index of the first boundary >= length.
        bucket = tf.searchsorted(self.boundaries, lengths, side="left")
        if self.drop_remainder:
            bucket = self._carry_leftovers_up(bucket)
        order = tf.argsort(bucket, stable=True)  # keeps the shuffled order inside a bucket
        bucket_sorted = tf.gather(bucket, order)

        counts = tf.math.bincount(
            tf.cast(bucket, tf.int32),
            minlength=self.num_buckets,
            maxlength=self.num_buckets,
            dtype=tf.int64,
        )
        full = counts // self.batch_sizes
        remainder = counts % self.batch_sizes
        if self.drop_remainder:
            remainder = tf.zeros_like(remainder)
        kept = full * self.batch_sizes + remainder
        batches_per_bucket = full + tf.cast(remainder > 0, tf.int64)

        # Position of each (sorted) pair inside its bucket -> batch index.
        first_in_bucket = tf.math.cumsum(counts, exclusive=True)
        position = tf.range(tf.size(order, out_type=tf.int64)) - tf.gather(first_in_bucket, bucket_sorted)
        keep = position < tf.gather(kept, bucket_sorted)
        first_batch = tf.math.cumsum(batches_per_bucket, exclusive=True)
        batch_in_bucket = position // tf.gather(self.batch_sizes, bucket_sorted)
        batch_id = tf.gather(first_batch, bucket_sorted) + batch_in_bucket
        rows, batch_id = tf.boolean_mask(order, keep), tf.boolean_mask(batch_id, keep)

        num_batches = tf.reduce_sum(batches_per_bucket)
        batch_bucket = tf.repeat(tf.range(self.num_buckets, dtype=tf.int64), batches_per_bucket)
        # Emit each batch when its last pair arrives (the order group_by_window
        # would give), instead of bucket by bucket: batches of all lengths
        # interleave, and shuffled pairs give a shuffled batch order.
        # rows are pool positions, ascending within a batch; batch_id is sorted.
        completion = tf.math.segment_max(rows, batch_id)
        emit_order = tf.argsort(completion, stable=True)  # new position -> old batch id
        new_id = tf.math.invert_permutation(tf.cast(emit_order, tf.int64))  # old -> new
        batch_id = tf.gather(new_id, batch_id)
        batch_bucket = tf.gather(batch_bucket, emit_order)
        regroup = tf.argsort(batch_id, stable=True)
        rows, batch_id = tf.gather(rows, regroup), tf.gather(batch_id, regroup)

        def group(x):
            return tf.RaggedTensor.from_value_rowids(tf.gather(x, rows), batch_id, nrows=num_batches)

        return group(src), group(tgt_in), group(tgt_out), tf.gather(self.boundaries, batch_bucket)


def token_budget_stats(batches, max_batches: int | None = None) -> dict:
    """Counts examples, real tokens and padding in batches from `make_batches`.

    Accepts any iterable of `((source_ids, target_input_ids), target_output_ids)`
    (padding id 0). The padding ratio counts the source and the target input
    (the target output pads exactly like the target input).

    Returns:
        dict with `num_batches`, `num_examples` (rows with tokens),
        `source_tokens`, `target_tokens` (non-pad), `padded_tokens` (all positions, both
        sides), `pad_tokens`, `padding_ratio` (pad / all), `max_batch_tokens`
        (largest `batch * length` of one side) and `shapes` (set of
        distinct source shapes).
    """
    stats = dict(
        num_batches=0,
        num_examples=0,
        source_tokens=0,
        target_tokens=0,
        padded_tokens=0,
        max_batch_tokens=0,
        shapes=set(),
    )
    for i, ((src, tgt_in), _) in enumerate(batches):
        if max_batches is not None and i >= max_batches:
            break
        src, tgt_in = src.numpy(), tgt_in.numpy()
        stats["num_batches"] += 1
        stats["num_examples"] += int((tgt_in != PAD_ID).any(axis=1).sum())  # not the empty rows that fill a batch
        stats["source_tokens"] += int((src != PAD_ID).sum())
        stats["target_tokens"] += int((tgt_in != PAD_ID).sum())
        stats["padded_tokens"] += src.size + tgt_in.size
        stats["max_batch_tokens"] = max(stats["max_batch_tokens"], src.size, tgt_in.size)
        stats["shapes"].add(src.shape)
    stats["pad_tokens"] = stats["padded_tokens"] - stats["source_tokens"] - stats["target_tokens"]
    stats["padding_ratio"] = stats["pad_tokens"] / max(stats["padded_tokens"], 1)
    return stats
