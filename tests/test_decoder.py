"""DecoderLayer and Decoder as Keras citizens (Keras's own layer test harness), and the cached call (§3.1)."""

import numpy as np
from keras.src import testing

from keras_transformer.layers import Decoder, DecoderLayer

_MEMORY = np.random.default_rng(0).normal(size=(2, 7, 8)).astype("float32")


class DecoderLayerTest(testing.TestCase):
    def test_decoder_layer_passes_the_keras_layer_test(self):
        self.run_layer_test(
            DecoderLayer,
            init_kwargs={"num_heads": 2, "d_ff": 16, "dropout": 0.1},
            input_shape=(2, 5, 8),
            call_kwargs={"memory": _MEMORY, "use_causal_mask": True},
            expected_output_shape=(2, 5, 8),
            # two attentions' W^Q, W^K, W^V, W^O; W_1, b_1, W_2, b_2; three LayerNorms' gamma and beta
            expected_num_trainable_weights=8 + 4 + 6,
            supports_masking=True,
            run_training_check=False,  # the harness's training model passes no `memory`
        )

    def test_decoder_passes_the_keras_layer_test(self):
        for norm_first in (False, True):
            self.run_layer_test(
                Decoder,
                init_kwargs={"num_layers": 2, "num_heads": 2, "d_ff": 16, "norm_first": norm_first},
                input_shape=(2, 5, 8),
                call_kwargs={"memory": _MEMORY},
                expected_output_shape=(2, 5, 8),
                expected_num_trainable_weights=2 * 18 + (2 if norm_first else 0),
                run_training_check=False,  # the harness's training model passes no `memory`
            )


def test_cached_decoding_equals_the_full_call():
    """Decoding step by step with the cache (`Decoder.decode`) gives the full (causal) call's outputs."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=(2, 5, 8)).astype("float32")
    source_mask = np.array([[True] * 7, [True] * 4 + [False] * 3])
    decoder = Decoder(num_layers=2, num_heads=2, d_ff=16)
    full = np.asarray(decoder(y, _MEMORY, memory_padding_mask=source_mask))
    cache = decoder.init_cache(_MEMORY, 5)
    steps = []
    for t in range(5):
        result = decoder.decode(y[:, t : t + 1], _MEMORY, memory_padding_mask=source_mask, cache=cache, cache_index=t)
        steps.append(np.asarray(result.output))
        cache = result.cache
        assert tuple(result.cross_attention_weights[0].shape) == (2, 2, 1, 7)
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)


def test_decode_without_a_cache_returns_no_cache_and_the_call_s_output():
    y = np.random.default_rng(2).normal(size=(2, 5, 8)).astype("float32")
    layer = DecoderLayer(num_heads=2, d_ff=16)
    result = layer.decode(y, _MEMORY, use_causal_mask=True)
    assert result.cache is None
    np.testing.assert_allclose(result.output, layer(y, _MEMORY, use_causal_mask=True), atol=1e-6)
    assert tuple(result.self_attention_weights.shape) == (2, 2, 5, 5)
