"""The searches' encoder pass (keras_transformer.decoding.encoding): length-sorted chunks, little padding."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import Transformer, TransformerConfig
from keras_transformer.decoding.encoding import encode_by_length

LENGTHS = [1, 9, 3, 17, 6, 12, 2, 9]  # unsorted, with a tie; 3 chunks of 3 rows, the last one short


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    config = TransformerConfig.tiny(vocab_size=20, num_layers=2, d_model=32, num_heads=4, d_ff=64, dropout=0.0)
    model = Transformer(config)
    ids = np.full((1, 3), 5, np.int32)
    model((ids, ids))
    return model


@pytest.fixture(scope="module")
def sources():
    rng = np.random.default_rng(0)
    out = np.zeros((len(LENGTHS), max(LENGTHS)), np.int32)
    for row, length in enumerate(LENGTHS):
        out[row, :length] = rng.integers(4, 20, size=length)
    return out


def test_each_sentence_gets_the_memory_of_the_whole_batch_encode(model, sources):
    chunked = tf.function(lambda ids: encode_by_length(model, ids, chunk_rows=3))(tf.constant(sources)).numpy()
    whole = model.encode(tf.constant(sources), training=False).numpy()
    assert chunked.shape == whole.shape
    for row, length in enumerate(LENGTHS):
        np.testing.assert_allclose(chunked[row, :length], whole[row, :length], atol=1e-5, err_msg=f"row {row}")


def test_each_chunk_is_cut_to_its_longest_sentence(model, sources):
    """Sorted lengths 1, 2, 3 | 6, 9, 9 | 12, 17: the encoder computes 3x3 + 3x9 + 2x17 positions, not 8x17."""
    positions = tf.Variable(0, dtype=tf.int64)

    class Counting:
        compute_dtype = model.compute_dtype
        config = model.config

        def encode(self, source_ids, training=None):
            positions.assign_add(tf.size(source_ids, out_type=tf.int64))
            return model.encode(source_ids, training=training)

    tf.function(lambda ids: encode_by_length(Counting(), ids, chunk_rows=3))(tf.constant(sources))
    assert int(positions.numpy()) == 3 * 3 + 3 * 9 + 2 * 17 < sources.size


@pytest.mark.parametrize("shape", [(0, 5), (4, 0)], ids=["no sentence", "no position"])
def test_an_empty_batch_gives_an_empty_memory(model, shape):
    memory = tf.function(lambda ids: encode_by_length(model, ids))(tf.zeros(shape, tf.int32))
    assert tuple(memory.shape) == shape + (32,)


def test_beam_search_over_several_chunks_equals_one_chunk(model, sources, monkeypatch):
    """The search's own call: chunks of 3 sentences, sorted and put back, decode as one chunk does."""
    from keras_transformer.decoding import encoding, make_decode_fn

    outputs = {}
    for rows in (3, len(LENGTHS)):
        monkeypatch.setattr(encoding, "ENCODE_CHUNK_ROWS", rows)
        search = make_decode_fn(model, "beam", beam_size=3, alpha=0.6, max_length=10)  # traced with `rows`
        outputs[rows] = [t.numpy() for t in search(tf.constant(sources))]
    np.testing.assert_array_equal(outputs[3][0], outputs[len(LENGTHS)][0])
    np.testing.assert_allclose(outputs[3][1], outputs[len(LENGTHS)][1], atol=1e-5)


def test_under_xla_the_batch_is_encoded_whole(model, sources):
    """XLA needs static shapes: one encoder call, the same memory as `model.encode`, padding included."""
    compiled = tf.function(lambda ids: encode_by_length(model, ids, chunk_rows=3), jit_compile=True)
    whole = model.encode(tf.constant(sources), training=False).numpy()
    np.testing.assert_allclose(compiled(tf.constant(sources)).numpy(), whole, atol=1e-5)


def test_padding_in_front_or_inside_loses_no_token(model, sources):
    """A chunk is cut after its sentences' last tokens, not after their token counts."""
    shifted = np.zeros((len(LENGTHS), max(LENGTHS) + 3), np.int32)
    for row, length in enumerate(LENGTHS):
        shifted[row, 3 : 3 + length] = sources[row, :length]  # three pads in front
        if length > 2:
            shifted[row, 4] = 0  # and one inside
    chunked = tf.function(lambda ids: encode_by_length(model, ids, chunk_rows=3))(tf.constant(shifted)).numpy()
    whole = model.encode(tf.constant(shifted), training=False).numpy()
    tokens = shifted != 0
    np.testing.assert_allclose(chunked[tokens], whole[tokens], atol=1e-5)
