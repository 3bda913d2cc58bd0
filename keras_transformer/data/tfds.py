"""TensorFlow Datasets translation sets (e.g. `wmt14_translate/de-en`, the paper's data) as text pairs."""

from __future__ import annotations

import tensorflow as tf

from keras_transformer.data.text import normalize_in_graph


def load_tfds(
    name: str,
    split: str = "train",
    src: str = "en",
    tgt: str = "de",
    data_dir: str | None = None,
    download: bool = True,
    shuffle_seed: int | None = None,
) -> tf.data.Dataset:
    """Loads a TensorFlow Datasets translation set as `(source_text, target_text)`.

    Translation datasets in tfds (`wmt14_translate/de-en`, `wmt_t2t_translate`,
    `ted_hrlr_translate/pt_to_en`, ...) yield dicts `{lang: text}`; this
    picks the two languages in the requested direction, applies the same
    whitespace normalization as `load_parallel_text` in-graph and drops pairs
    with an empty side (not counted: the data is streamed).

    Args:
        name: tfds name with config, e.g. `"wmt14_translate/de-en"`.
        split: tfds split ("train", "validation", "test", or slices like "train[:1%]").
        src, tgt: language keys of the source and target side.
        data_dir: tfds data directory (tfds default if None).
        download: let tfds download and prepare the data if needed. Note that
            WMT sets need a large download; there is no network here except
            PyPI, so this is for machines that have one.
        shuffle_seed: None reads the split's files in order; a seed reads them
            in an order shuffled with it, interleaved (tfds' `shuffle_files`),
            so that streams of different seeds begin at different places.

    Raises:
        ValueError: if `src` or `tgt` is not a language of the dataset.
    """
    import tensorflow_datasets as tfds  # heavy import; only needed here

    builder = tfds.builder(name, data_dir=data_dir)
    languages = sorted(builder.info.features.keys())
    for role, lang in (("src", src), ("tgt", tgt)):
        if lang not in languages:
            raise ValueError(f"{role}={lang!r} is not a language of {name}; valid: {languages}")
    if download:
        builder.download_and_prepare()
    if shuffle_seed is None:
        dataset = builder.as_dataset(split=split, shuffle_files=False)
    else:
        dataset = builder.as_dataset(
            split=split, shuffle_files=True, read_config=tfds.ReadConfig(shuffle_seed=shuffle_seed)
        )

    def to_pair(example):
        return normalize_in_graph(example[src]), normalize_in_graph(example[tgt])

    dataset = dataset.map(to_pair, num_parallel_calls=tf.data.AUTOTUNE)
    return dataset.filter(lambda s, t: tf.logical_and(tf.strings.length(s) > 0, tf.strings.length(t) > 0))
