"""One batching routine for every translator: sentences in length order, even batches, several in flight.

`Translator.translate` (a model in this process) and
`SavedModelTranslator.translate` (an exported SavedModel) both call
`translate_in_batches`, which needs of its translator only what both have:

- `translate_strings(inputs)`: tf.string `[N]` -> `{"translations", "scores"}`;
- `n_best_strings(inputs, n_best)`: the same with `[N, n_best]` outputs,
  raising `ValueError` for an `n_best` it cannot give;
- with target prefixes (`inference.prefixes`), `translate_with_prefix(inputs,
  target_prefixes)` and `n_best_strings(inputs, n_best, target_prefixes)`,
  and what `prefixes.overlong_prefixes` reads;
- with alignments (`inference.alignments`), `aligned_strings(inputs, n_best,
  target_prefixes)`: the same outputs and `"alignments"`;
- `max_batch_size`: the most sentences one call takes (None: no limit known).

Decoding a batch is a chain of small ops that leaves cores idle, so
`workers` batches are decoded at the same time, each round of `workers`
batches dealt sentences of the same lengths so that no worker waits for
another (`even_batches`; measurements in `benchmarks/README.md`,
"Batching of translate"). Results do not depend on the batching, except
sampled ones: a seeded sample depends on the sentence's batch
(`decoding.sampling_search`).
"""

import concurrent.futures
import contextlib
import sys

import numpy as np

from keras_transformer.decoding.defaults import DEFAULT_TRANSLATE_BATCH_SIZE, DEFAULT_TRANSLATE_WORKERS
from keras_transformer.errors import ParameterError

# The first window of `translate_stream`, in sentences per worker; each next window is twice as large.
STREAM_FIRST_WINDOW = 8


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
    target_prefixes=None,
    alignments=False,
):
    """Translates a list of str with `translator`, `workers` batches at a time; see `Translator.translate`.

    Args:
        translator: a `Translator` or a `SavedModelTranslator` (the module
            docstring says what it needs).
        sentences, batch_size, progress, return_scores, workers, n_best,
            target_prefixes, alignments: as `Translator.translate`; each
            prefix goes with its sentence into whichever batch the sentence is in.

    Returns:
        As `Translator.translate`.

    Raises:
        ParameterError: `workers` or `batch_size` out of range, an `n_best`
            the translator cannot give, bad `target_prefixes`
            (`prefixes.checked_target_prefixes`), or `alignments` the
            translator cannot give (with these options), before any sentence is decoded.
    """
    sentences = list(sentences)
    prefixes = _check_options(translator, batch_size, workers, n_best, sentences, target_prefixes, alignments)
    results = [None] * len(sentences)
    bar = _progress_bar(len(sentences)) if progress else None
    # All batches go to the pool at once: a `tf.function` traces under a lock, so the first
    # calls of two threads trace it once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        order = length_order(sentences)
        for batch in _decode(pool, translator, sentences, order, batch_size, workers, n_best, prefixes, alignments):
            for row, result in batch:
                results[row] = result
            _advance(bar, len(batch))
    if n_best is not None:
        return [list(zip(*result)) for result in results]
    translations, scores = [r[0] for r in results], [r[1] for r in results]
    answer = (translations, scores) if return_scores else (translations,)
    if alignments:
        answer = (*answer, [r[2] for r in results])
    return answer if len(answer) > 1 else translations


def stream_windows(count, batch_size, workers, first=STREAM_FIRST_WINDOW):
    """`(start, stop)` of the consecutive windows of `count` sentences that `translate_stream` decodes.

    The first holds `first` sentences per worker, each next one twice as many,
    up to a round of full batches (`batch_size * workers`): the first
    translations come soon, and long inputs are still decoded in full batches.

    Example:
        >>> stream_windows(100, batch_size=16, workers=2, first=4)
        [(0, 8), (8, 24), (24, 56), (56, 88), (88, 100)]
    """
    windows, start, size = [], 0, max(1, first) * workers
    while start < count:
        size = min(size, batch_size * workers)
        windows.append((start, min(count, start + size)))
        start += size
        size *= 2
    return windows


def translate_stream(
    translator,
    sentences,
    batch_size=DEFAULT_TRANSLATE_BATCH_SIZE,
    progress=False,
    workers=DEFAULT_TRANSLATE_WORKERS,
    n_best=None,
    target_prefixes=None,
    alignments=False,
):
    """Yields the translation of each sentence, in input order, as soon as it and those before it are decoded.

    The sentences are decoded window by window (`stream_windows`), each
    window in length order and even batches as `translate_in_batches`
    decodes all of them; the answers are the same, since a sentence's
    translation does not depend on its batch (a sampled one does: this
    order's batches draw their own samples). A reader of the output (a
    pipe) sees it grow, and a stopped run keeps what was yielded.

    Args:
        translator, sentences, batch_size, progress, workers, n_best,
            target_prefixes, alignments: as `Translator.translate`.

    Yields:
        `(translation, score)` per sentence (`(translation, score, alignment)` with `alignments`), or with
        `n_best` a list of `n_best` of them, best first.

    Raises:
        ParameterError: as `translate_in_batches`, at the first `next()`.
    """
    sentences = list(sentences)
    prefixes = _check_options(translator, batch_size, workers, n_best, sentences, target_prefixes, alignments)
    bar = _progress_bar(len(sentences)) if progress else None
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
    try:
        for start, stop in stream_windows(len(sentences), batch_size, workers):
            order = start + length_order(sentences[start:stop])
            window = {}
            for batch in _decode(pool, translator, sentences, order, batch_size, workers, n_best, prefixes, alignments):
                window.update(batch)
                _advance(bar, len(batch))
            for row in range(start, stop):
                result = window.pop(row)
                yield list(zip(*result)) if n_best is not None else result
    except BaseException:
        if bar is not None:
            sys.stderr.write("\n")  # ends the progress bar's line: what stops the stream may say why below it
        raise
    finally:  # a stopped reader (Ctrl-C, a closed pipe) does not wait for the batches queued behind
        pool.shutdown(wait=False, cancel_futures=True)


def truncated_sentences(translator, sentences):
    """`(index, pieces, size)` of the sentences longer than the translator reads.

    A sentence is cut to the translator's `max_input_bytes` (`size`: its
    length in bytes if it was, else None), then translated from its first
    `max_input_length - 1` subwords (`Translator.source_ids`); `pieces`
    counts the subwords of what is left after the cut. None where the
    translator does not say how long its inputs may be.
    """
    from keras_transformer.inference.sentences import cut_to_bytes

    limit = getattr(translator, "max_input_length", None)
    if not limit or not sentences:
        return []
    max_bytes = getattr(translator, "max_input_bytes", None)
    sizes = [len(sentence.encode("utf-8", "surrogateescape")) for sentence in sentences]
    # Cut as `Translator.bounded` cuts them, and so never tokenized whole here either.
    sentences = [cut_to_bytes(sentence, max_bytes) for sentence in sentences]
    pieces = translator.source_pieces(list(sentences))
    return [
        (index, int(count), size if max_bytes and size > max_bytes else None)
        for index, (count, size) in enumerate(zip(pieces, sizes))
        if count > limit - 1 or (max_bytes and size > max_bytes)
    ]


def _check_options(translator, batch_size, workers, n_best, sentences, target_prefixes, alignments=False):
    """Refuses `workers`, `batch_size`, `n_best`, `target_prefixes` or `alignments` before any sentence is decoded.

    Returns the prefixes as a list of str (`prefixes.checked_target_prefixes`), or None.
    """
    import tensorflow as tf

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ParameterError("workers", f"must be a positive integer, got {workers!r}.")
    limit = translator.max_batch_size
    if not 1 <= batch_size <= (limit or batch_size):
        raise ParameterError(
            "batch_size",
            f"must be between 1 and {limit}, got {batch_size}." if limit else f"must be at least 1, got {batch_size}.",
        )
    if n_best is not None:
        translator.n_best_strings(tf.constant([], tf.string), n_best)  # checks n_best before any work
    prefixes = None
    if target_prefixes is not None:
        from keras_transformer.inference.prefixes import checked_target_prefixes

        prefixes = checked_target_prefixes(translator, sentences, target_prefixes)
        if n_best is not None:  # the translator may not take both
            translator.n_best_strings(tf.constant([], tf.string), n_best, tf.constant([], tf.string))
    if alignments:
        if not hasattr(translator, "aligned_strings"):
            raise ParameterError(
                "alignments", f"cannot be given: a {type(translator).__name__} gives no word alignments."
            )
        nothing = tf.constant([], tf.string)  # the translator may not give them with these options
        translator.aligned_strings(nothing, n_best, None if prefixes is None else nothing)
    return prefixes


def _decode(pool, translator, sentences, order, batch_size, workers, n_best, prefixes=None, alignments=False):
    """Yields, batch by batch in submission order, `[(row, (text, score)), ...]` of the sentences `order` names
    (`(text, score, alignment)` with `alignments`).

    `prefixes`: None, or the target prefix of each sentence (a list of str), decoded with it.
    """
    import tensorflow as tf

    def run(rows):
        inputs = tf.constant([sentences[i] for i in rows], tf.string)
        given = None if prefixes is None else tf.constant([prefixes[i] for i in rows], tf.string)
        if alignments:
            return rows, translator.aligned_strings(inputs, n_best, given)
        if prefixes is not None:
            if n_best is None:
                return rows, translator.translate_with_prefix(inputs, given)
            return rows, translator.n_best_strings(inputs, n_best, given)
        if n_best is None:
            return rows, translator.translate_strings(inputs)
        return rows, translator.n_best_strings(inputs, n_best)

    # All batches go to the pool at once: a `tf.function` traces under a lock, so the first
    # calls of two threads trace it once.
    names = ("translations", "scores", "alignments") if alignments else ("translations", "scores")
    for rows, out in pool.map(run, even_batches(order, batch_size, workers)):
        yield [(row, _decoded(*values)) for row, *values in zip(rows, *(out[name].numpy() for name in names))]


def _progress_bar(count):
    import keras

    return keras.utils.Progbar(count, unit_name="sentence")


def _advance(bar, count):
    if bar is not None:
        # Keras' Progbar writes to stdout, which holds the translations.
        with contextlib.redirect_stdout(sys.stderr):
            bar.add(count)


def _decoded(text, score, *alignment):
    """Bytes and score (or arrays of them, for n-best lists), and the alignment if given -> str and float (or
    lists), and str (or a list)."""
    if isinstance(text, bytes):
        return (text.decode("utf-8"), float(score), *(a.decode("utf-8") for a in alignment))
    return ([t.decode("utf-8") for t in text], [float(x) for x in score], *([a.decode() for a in x] for x in alignment))
