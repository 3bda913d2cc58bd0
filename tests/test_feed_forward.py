"""FeedForward as a Keras citizen: Keras's own layer test harness (§3.3)."""

from keras.src import testing

from keras_transformer.layers import FeedForward


class FeedForwardLayerTest(testing.TestCase):
    def test_passes_the_keras_layer_test(self):
        self.run_layer_test(
            FeedForward,
            init_kwargs={"d_ff": 16, "output_dim": 6},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 6),
            expected_num_trainable_weights=4,  # W_1, b_1, W_2, b_2
            supports_masking=True,
        )
