"""SharedEmbedding as a Keras citizen: Keras's own layer test harness (§3.4)."""

from keras.src import testing

from keras_transformer.layers import SharedEmbedding


class SharedEmbeddingLayerTest(testing.TestCase):
    def test_passes_the_keras_layer_test(self):
        self.run_layer_test(
            SharedEmbedding,
            init_kwargs={"vocab_size": 20, "d_model": 8},
            input_shape=(2, 5),
            input_dtype="int32",
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=1,
            run_training_check=False,  # integer inputs: the harness's training step differentiates the inputs' model
        )
