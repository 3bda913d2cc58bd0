"""PositionalEncoding and LearnedPositionalEmbedding as Keras citizens: Keras's own layer test harness (§3.5)."""

import keras
import numpy as np
from keras.src import testing

from keras_transformer.layers import LearnedPositionalEmbedding, PositionalEncoding


class PositionalEncodingLayerTest(testing.TestCase):
    def test_sinusoidal_passes_the_keras_layer_test(self):
        self.run_layer_test(
            PositionalEncoding,
            init_kwargs={},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=0,
            supports_masking=True,
            run_training_check=False,  # no weights to train
        )

    def test_learned_passes_the_keras_layer_test(self):
        self.run_layer_test(
            LearnedPositionalEmbedding,
            init_kwargs={"max_length": 6},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            expected_num_trainable_weights=1,
            supports_masking=True,
        )

    def test_both_keep_the_keras_mask_of_their_inputs(self):
        """A mask from `Embedding(mask_zero=True)` reaches the layers after the positions, whichever they are."""
        ids = np.array([[5, 6, 0], [7, 0, 0]])
        for positions in (PositionalEncoding(), LearnedPositionalEmbedding(max_length=4)):
            embedded = keras.layers.Embedding(10, 4, mask_zero=True)(ids)
            outputs = positions(embedded)
            np.testing.assert_array_equal(np.asarray(outputs._keras_mask), ids != 0, err_msg=positions.name)
