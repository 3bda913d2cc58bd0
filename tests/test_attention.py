"""MultiHeadAttention as a Keras citizen: Keras's own layer test harness (§3.2.2)."""

import numpy as np
from keras.src import testing

from keras_transformer.layers import MultiHeadAttention


class MultiHeadAttentionLayerTest(testing.TestCase):
    def test_self_attention_passes_the_keras_layer_test(self):
        """Build, config and serialization round trips, a training step, mixed_float16 output dtype = spec."""
        self.run_layer_test(
            MultiHeadAttention,
            init_kwargs={"num_heads": 2, "key_dim": 4, "use_bias": True},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=8,
            expected_num_non_trainable_weights=0,
            supports_masking=True,
        )

    def test_cross_attention_passes_the_keras_layer_test(self):
        """Keys and values from a memory of another length, given as a call argument (the harness builds from the
        query's shape alone, so the memory has the query's width)."""
        memory = np.random.default_rng(1).normal(size=(2, 7, 8)).astype("float32")
        self.run_layer_test(
            MultiHeadAttention,
            init_kwargs={"num_heads": 2, "key_dim": 3, "value_dim": 5, "output_dim": 6},
            input_shape=(2, 4, 8),
            call_kwargs={"key_value": memory},
            expected_output_shape=(2, 4, 6),
            expected_num_trainable_weights=4,
            supports_masking=True,
        )

    def test_mixed_float16_output_has_the_dtype_of_its_symbolic_spec(self):
        import keras

        layer = MultiHeadAttention(num_heads=2, key_dim=4, dtype="mixed_float16")
        x = np.ones((1, 3, 8), "float16")
        output = layer(x)
        spec = layer.compute_output_spec(keras.KerasTensor((1, 3, 8), dtype="float16"))
        self.assertEqual(keras.backend.standardize_dtype(output.dtype), "float16")
        self.assertEqual(spec.dtype, "float16")
