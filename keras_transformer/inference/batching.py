"""One batching routine for every translator: sentences in length order, even batches, several in flight.

`Translator.translate` (a model in this process) and
`SavedModelTranslator.translate` (an exported SavedModel) both call
`translate_in_batches`, which needs of its translator only what both have:

- `translate_strings(inputs)`: tf.string `[N]` -> `{"translations", "scores"}`;
- `n_best_strings(inputs, n_best)`: the same with `[N, n_best]` outputs,
  raising `ValueError` for an `n_best` it cannot give;
- `max_batch_size`: the most sentences one call takes (None: no limit known).

Decoding a batch is a chain of small ops that leaves cores idle, so
`workers` batches are decoded at the same time, each round of `workers`
batches dealt sentences of the same lengths so that no worker waits for
another (`even_batches`; measurements in `benchmarks/README.md`,
"Batching of translate"). Results do not depend on the batching.
"""

import concurrent.futures
import contextlib
import sys

import numpy as np

from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE, DEFAULT_TRANSLATE_WORKERS


def length_order(sentences):
    """The indices of `sentences` (str), longest first in UTF-8 bytes: errors show early.

    Example:
        >>> length_order(["a", "abc", "ab"]).tolist()
        [1, 2, 0]
    """
    lengths = [len(s.encode("utf-8", "replace")) for s in sentences]
    return np.argsort(lengths, kind="stable")[::-1]


def even_batches(order, batch_size, workers):
    """`order` (sentence indices, longest first) cut into batches of at most `batch_size`, for `workers` at a time.

    The batches are as even in size as their number allows, and once there
    is more than one, their number is a multiple of `workers`, so no worker
    idles while another decodes a far larger batch: 600 sentences in
    batches of at most 512 for 2 workers are two of 300, not 512 and 88.
    They come in rounds of `workers` batches, one per worker, longest
    sentences first; a round's sentences are dealt out in turn, so its
    batches hold sentences of the same lengths and take as long, where
    consecutive slices of the order would give one worker all the round's
    longest sentences.

    Args:
        order: sentence indices, longest sentence first (`length_order`).
        batch_size: the most sentences per batch.
        workers: batches decoded at the same time.

    Returns:
        A list of arrays of indices, in the order to submit them.

    Example:
        >>> [b.tolist() for b in even_batches(list(range(6)), batch_size=2, workers=2)]
        [[0, 2], [1, 3], [4], [5]]
    """
    count = -(-len(order) // batch_size)
    if count > 1:
        count = -(-count // workers) * workers
    pieces = np.array_split(np.asarray(order), count) if count else []
    batches = []
    for start in range(0, len(pieces), workers):
        turn = pieces[start : start + workers]  # one round: a slice of the order, dealt to its batches
        sentences = np.concatenate(turn)
        batches.extend(sentences[j :: len(turn)] for j in range(len(turn)))
    return [batch for batch in batches if len(batch)]


def translate_in_batches(
    translator,
    sentences,
    batch_size=DEFAULT_TRANSLATE_BATCH_SIZE,
    progress=False,
    return_scores=False,
    workers=DEFAULT_TRANSLATE_WORKERS,
    n_best=None,
):
    """Translates a list of str with `translator`, `workers` batches at a time; see `Translator.translate`.

    Args:
        translator: a `Translator` or a `SavedModelTranslator` (the module
            docstring says what it needs).
        sentences, batch_size, progress, return_scores, workers, n_best: as
            `Translator.translate`.

    Returns:
        As `Translator.translate`.

    Raises:
        ValueError: `workers` or `batch_size` out of range, or an `n_best`
            the translator cannot give (before any sentence is decoded).
    """
    import keras
    import tensorflow as tf

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive integer, got {workers!r}.")
    limit = translator.max_batch_size
    if not 1 <= batch_size <= (limit or batch_size):
        raise ValueError(
            f"batch_size must be between 1 and {limit}, got {batch_size}."
            if limit
            else f"batch_size must be at least 1, got {batch_size}."
        )
    if n_best is not None:
        translator.n_best_strings(tf.constant([], tf.string), n_best)  # checks n_best before any work
    sentences = list(sentences)
    chunks = even_batches(length_order(sentences), batch_size, workers)
    results = [None] * len(sentences)
    bar = keras.utils.Progbar(len(sentences), unit_name="sentence") if progress else None

    def run(rows):
        inputs = tf.constant([sentences[i] for i in rows], tf.string)
        if n_best is None:
            return rows, translator.translate_strings(inputs)
        return rows, translator.n_best_strings(inputs, n_best)

    # All batches go to the pool at once: a `tf.function` traces under a lock, so the first
    # calls of two threads trace it once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        for rows, out in pool.map(run, chunks):
            for row, text, score in zip(rows, out["translations"].numpy(), out["scores"].numpy()):
                results[row] = _decoded(text, score)
            if bar is not None:
                # Keras' Progbar writes to stdout, which holds the translations.
                with contextlib.redirect_stdout(sys.stderr):
                    bar.add(len(rows))
    if n_best is not None:
        return [list(zip(*result)) for result in results]
    translations, scores = [r[0] for r in results], [r[1] for r in results]
    return (translations, scores) if return_scores else translations


def _decoded(text, score):
    """Bytes and score (or arrays of them, for n-best lists) -> str and float (or lists)."""
    if isinstance(text, bytes):
        return text.decode("utf-8"), float(score)
    return [t.decode("utf-8") for t in text], [float(x) for x in score]
