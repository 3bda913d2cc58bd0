"""The training data as a deterministic stream of token-budget batches (§5.1), and where step N is in it.

Deterministic for a given seed unless `subword_sampling` segments the training
sentences at random (SentencePiece's own random generator).

A corpus held in memory (up to `data.MAX_DEFAULT_POOL_SIZE` pairs) is read in
exact passes, and step N has one place in them. A streamed corpus (`tfds:`,
or more pairs than that) has no such place: one process reads it as one
stream, from one `fit` call to the next, and a resumed process starts a new
stream, seeded by its step (`TrainingData.stream`).
"""

from __future__ import annotations

import functools
import logging
import math

import numpy as np
import tensorflow as tf

from keras_transformer import data
from keras_transformer.errors import ParameterError

logger = logging.getLogger(__name__)


def materialize(dataset):
    """A `(source_text, target_text)` dataset as two `tf.string` tensors."""
    sources, targets = [], []
    for src, tgt in dataset.batch(65536):
        sources.append(src)
        targets.append(tgt)
    if not sources:
        raise ValueError("The training data is empty.")
    return tf.concat(sources, 0), tf.concat(targets, 0)


def count_batches_per_epoch(pairs, tokenizer, batch_tokens, max_length, num_replicas, boundaries=None):
    """Batches `make_batches(..., drop_remainder=True)` yields for one pass over these pairs.

    With only whole batches, this is `data.whole_batches(n, sizes)` over the
    length buckets (n[k] pairs of bucket k, sizes[k] sentences per batch),
    whatever the order of the pairs: every shuffled pass has this many batches.
    `boundaries`: the length buckets the batches use (default
    `data.default_bucket_boundaries(max_length)`). Pairs longer than
    `max_length` are left out of training, and a warning says how many.
    """
    if boundaries is None:
        boundaries = data.default_bucket_boundaries(max_length)
    boundaries = data.checked_bucket_boundaries(boundaries, max_length)
    sizes = data.bucket_batch_sizes(boundaries, batch_tokens, num_replicas)
    src, tgt = pairs
    counts = np.zeros(len(boundaries), np.int64)
    chunk, bytes_per_token = 8192, data.max_bytes_per_token(tokenizer)
    for start in range(0, int(src.shape[0]), chunk):
        src_chunk, tgt_chunk = src[start : start + chunk], tgt[start : start + chunk]
        # As make_batches: not tokenized.
        fits_bytes = data.within_byte_limit(src_chunk, tgt_chunk, max_length, bytes_per_token)
        src_chunk, tgt_chunk = tf.boolean_mask(src_chunk, fits_bytes), tf.boolean_mask(tgt_chunk, fits_bytes)
        s_len = tokenizer.tokenize(src_chunk).row_lengths().numpy() + 1
        t_len = tokenizer.tokenize(tgt_chunk).row_lengths().numpy() + 1
        fits = (s_len <= max_length) & (t_len <= max_length)
        length = np.maximum(s_len, t_len)[fits]
        bucket = np.searchsorted(np.asarray(boundaries), length, side="left")
        counts += np.bincount(bucket, minlength=len(boundaries))
    total = int(src.shape[0])
    if counts.sum() < total:
        logger.warning(
            "%d of %d training pairs (%.2f%%) have a side longer than max_length %d tokens (with the end "
            "or start token) and are left out of training.",
            total - counts.sum(),
            total,
            100.0 * (total - counts.sum()) / total,
            max_length,
        )
    return data.whole_batches(counts, sizes)


class TrainingData:
    """The deterministic stream of training batches and where step N is in it."""

    def __init__(self, args, tokenizer, text, num_replicas, max_length):
        self.args = args
        self.tokenizer = tokenizer
        self.num_replicas = num_replicas
        self.max_length = max_length
        self.boundaries = data.default_bucket_boundaries(max_length, multiple=args.pad_to_multiple_of)
        self.options = tf.data.Options()
        # Every worker builds the same global batches and keeps its replicas' slices.
        self.options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        self.text = text
        # Batches per step: one optimizer update takes this many (`training.accumulation`).
        self.accumulate_steps = args.accumulate_steps
        self.tensors = None
        self._iterator = None  # of a streamed corpus, kept from one fit call to the next (`batches`)
        self.streamed = data.DataSpec.parse(args.data).streamed
        if not self.streamed:
            self.tensors = materialize(text)
            self.num_pairs = int(self.tensors[0].shape[0])
            # One length-sorting pool per pass needs the pass in memory: beyond
            # make_batches' largest default pool, stream (and reseed on resume) instead.
            if self.num_pairs > data.MAX_DEFAULT_POOL_SIZE:
                self.streamed = True

    def batches_per_epoch(self):
        if self.streamed and (self.args.steps_per_epoch or self.tensors is None):
            return self.args.steps_per_epoch or 1000
        # Exact for in-memory passes; for a large in-memory corpus streamed in
        # several pools, close (each pool drops its longest bucket's leftovers).
        # With subword sampling, sentences are segmented into more pieces than
        # here, so a pass has more batches than this count: Keras' epochs end
        # before the end of a pass, "epochs" count steps rather than passes,
        # and a resumed run continues at an approximate place with new samples.
        return count_batches_per_epoch(
            self.tensors, self.tokenizer, self.args.batch_tokens, self.max_length, self.num_replicas, self.boundaries
        )

    def steps_per_epoch(self):
        """Training steps (optimizer updates) per epoch: `batches_per_epoch`, over `accumulate_steps`.

        With accumulation, an in-memory epoch is the whole updates of one pass:
        the pass's last batches that make no whole update are left out
        (`stream`). A streamed corpus's `args.steps_per_epoch` counts updates.

        Raises:
            ParameterError: (`accumulate_steps`) a pass holds fewer batches than one update takes.
        """
        batches = self.batches_per_epoch()
        if self.accumulate_steps == 1 or (self.streamed and (self.args.steps_per_epoch or self.tensors is None)):
            return batches
        if 0 < batches < self.accumulate_steps:
            raise ParameterError(
                "accumulate_steps",
                f"({self.accumulate_steps}) is more than the {batches} batches of a pass over the training data: "
                "no whole update. Give fewer batches per update, or a smaller batch_tokens.",
            )
        return batches // self.accumulate_steps

    def _shuffled_pairs(self, seed, index):
        """The pairs in memory in the random order number `index` of `seed`."""
        src, tgt = self.tensors
        seed = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        order = tf.argsort(tf.random.stateless_uniform(tf.shape(src), seed=seed))
        return tf.data.Dataset.from_tensor_slices((tf.gather(src, order), tf.gather(tgt, order)))

    def _epoch_batches(self, epoch):
        pairs = self._shuffled_pairs(self.args.seed, epoch)
        # One pool per pass: every pass has exactly whole_batches(n, sizes) batches.
        return data.make_batches(
            pairs,
            self.tokenizer,
            batch_tokens=self.args.batch_tokens,
            max_length=self.max_length,
            bucket_boundaries=self.boundaries,
            shuffle=False,
            num_replicas=self.num_replicas,
            drop_remainder=True,
            pool_size=self.num_pairs,
            sampling_alpha=self.args.subword_sampling,
        )

    def stream(self, start_step, steps_per_epoch):
        """Batches from global step `start_step` on (infinite); a step takes `accumulate_steps` batches.

        In memory: the batches an uninterrupted run has from that step. Streamed:
        a new stream seeded by `start_step`, which does not go on from where an
        interrupted run's stream was. A corpus in memory is read in passes over
        all its pairs, each in a new random order; a tfds split in the order it
        is read (its files in an order of the same seed, `DataSpec.load`'s
        `shuffle_seed`) through a shuffle buffer of 100,000 pairs. With
        accumulation, an in-memory pass ends after its `steps_per_epoch`
        whole updates.
        """
        if self.streamed:
            seed = self.args.seed + start_step
            pairs, in_memory = self.text, self.tensors is not None
            if in_memory:
                # A shuffle buffer would keep each pass close to the file order, and every
                # stream would start with the corpus's first pairs.
                pairs = tf.data.Dataset.range(2**62).flat_map(functools.partial(self._shuffled_pairs, seed))
            dataset = data.make_batches(
                pairs,
                self.tokenizer,
                batch_tokens=self.args.batch_tokens,
                max_length=self.max_length,
                bucket_boundaries=self.boundaries,
                shuffle=not in_memory,
                seed=seed,
                num_replicas=self.num_replicas,
                repeat=not in_memory,
                drop_remainder=True,
                sampling_alpha=self.args.subword_sampling,
            )
        else:
            first_epoch, skip = divmod(start_step, steps_per_epoch)
            epoch_batches, per_step = self._epoch_batches, self.accumulate_steps
            if per_step > 1:  # each pass: its whole updates only

                def epoch_batches(epoch):
                    return self._epoch_batches(epoch).take(steps_per_epoch * per_step)

            dataset = tf.data.Dataset.range(first_epoch, 2**62).flat_map(epoch_batches)
            if skip:
                dataset = dataset.skip(skip * per_step)
            dataset = dataset.prefetch(tf.data.AUTOTUNE)
        return dataset.with_options(self.options)

    def batches(self, step, steps_per_epoch, count=None):
        """The data of one `fit` call from global step `step` on: the batches of `count` steps, or no end (None).

        In memory: `stream(step)`. A streamed corpus is read by one iterator,
        made at the process's first call: each later call goes on where the
        previous one stopped (a new `stream` would start over, at the same
        first pairs every epoch).
        """
        if count is not None:
            count *= self.accumulate_steps  # batches of `count` steps
        if not self.streamed:
            dataset = self.stream(step, steps_per_epoch)
            return dataset if count is None else dataset.take(count)
        if self._iterator is None:
            self._iterator = iter(self.stream(step, steps_per_epoch))
        iterator = self._iterator
        # A batch leaves the kept iterator only when fit asks for one: none is read ahead and lost.
        dataset = tf.data.Dataset.from_tensors(0).repeat(count).map(lambda _: iterator.get_next())
        return dataset.with_options(self.options)

    def validation(self, text):
        """The validation batches, tokenized and batched once and held in memory.

        Keras drops its validation iterator at every evaluation, and dropping
        a live pipeline (tokenizer, parallel map, bucketing) can block `fit`
        at an epoch's end while it winds down. A dataset of ready tensors has
        nothing to wind down, and a known length.
        """
        dataset = data.make_batches(
            text,
            self.tokenizer,
            batch_tokens=self.args.batch_tokens,
            max_length=self.max_length,
            bucket_boundaries=self.boundaries,
            shuffle=False,
            num_replicas=self.num_replicas,
            drop_remainder=False,
        )
        batches = [tf.data.Dataset.from_tensors(batch) for batch in dataset]
        if not batches:
            raise ValueError("The validation split has no sentence pairs within max_length.")
        dataset = functools.reduce(lambda a, b: a.concatenate(b), batches)
        return dataset.with_options(self.options)


def fit_plan(step, total_steps, steps_per_epoch, steps_per_execution=1):
    """`fit` calls `(initial_epoch, epochs, steps_per_epoch)` from `step` to `total_steps`.

    Keras epochs have a fixed number of steps, so a run resumed inside an epoch
    first finishes that epoch in a `fit` call of its own; a last, partial epoch
    is cut by the monitor's stop at `total_steps`. With `steps_per_execution`
    > 1, one call per epoch, each with its exact number of steps (`loop._fit_calls` ends
    each call's data there: Keras would otherwise run the last execution of an
    epoch whole, past the epoch's end or `total_steps`).
    """
    if steps_per_execution > 1:
        plan = []
        while step < total_steps:
            epoch, into = divmod(step, steps_per_epoch)
            steps = min(steps_per_epoch - into, total_steps - step)
            plan.append((epoch, epoch + 1, steps))
            step += steps
        return plan
    plan = []
    epoch, into = divmod(step, steps_per_epoch)
    if into:
        left = min(steps_per_epoch - into, total_steps - step)
        plan.append((epoch, epoch + 1, left))
        step += left
        epoch += 1
    if step < total_steps:
        last_epoch = math.ceil(total_steps / steps_per_epoch)
        per_epoch = steps_per_epoch if last_epoch - epoch > 1 else total_steps - step
        plan.append((epoch, last_epoch, per_epoch))
    return plan
