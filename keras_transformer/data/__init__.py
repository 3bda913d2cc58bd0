"""The data: parallel text in, token-budget batches out (Vaswani et al., 2017, §5.1).

- `spec`: `DataSpec`, `load_dataset`: where the data comes from ("multi30k",
  "tfds:NAME", "files:SRC,TGT").
- `text`: `read_text_lines`, `load_parallel_text`: aligned text files.
- `corpora`: the shipped Multi30k and newstest2014.
- `tfds`: `load_tfds`: TensorFlow Datasets translation sets.
- `tokenizer`: `Tokenizer`, `train_tokenizer`: joint SentencePiece BPE, in-graph
  through tensorflow-text.
- `batching`: `make_batches`: length buckets and a token budget per batch.

Every loader gives a `tf.data.Dataset` of `(source_text, target_text)` scalar
`tf.string` pairs; `make_batches` turns it into
`((source_ids, target_input_ids), target_output_ids)` for `model.fit`.

Example:

    from keras_transformer.data import load_dataset, make_batches
    from keras_transformer.data.corpora import read_lines
    from keras_transformer.run_dir import get_or_train_tokenizer

    tokenizer = get_or_train_tokenizer(
        "runs/base", lambda: read_lines("train", "en") + read_lines("train", "de"), vocab_size=8000)
    train = make_batches(load_dataset("multi30k", "train"), tokenizer, batch_tokens=4096)
    val = make_batches(load_dataset("multi30k", "val"), tokenizer, shuffle=False)
    model.fit(train, validation_data=val, epochs=...)
"""

from keras_transformer.data.batching import (
    MAX_BYTES_PER_TOKEN,
    MAX_DEFAULT_POOL_SIZE,
    bucket_batch_sizes,
    checked_bucket_boundaries,
    default_bucket_boundaries,
    make_batches,
    max_bytes_per_token,
    token_budget_stats,
    whole_batches,
    within_byte_limit,
)
from keras_transformer.data.spec import DataSpec, load_dataset
from keras_transformer.data.text import (
    ParallelTextStats,
    check_text_file,
    load_parallel_text,
    normalize_line,
    read_text_lines,
)
from keras_transformer.data.tfds import load_tfds

__all__ = [
    "MAX_BYTES_PER_TOKEN",
    "MAX_DEFAULT_POOL_SIZE",
    "DataSpec",
    "ParallelTextStats",
    "bucket_batch_sizes",
    "checked_bucket_boundaries",
    "default_bucket_boundaries",
    "load_dataset",
    "load_parallel_text",
    "check_text_file",
    "load_tfds",
    "make_batches",
    "max_bytes_per_token",
    "normalize_line",
    "read_text_lines",
    "token_budget_stats",
    "whole_batches",
    "within_byte_limit",
]
