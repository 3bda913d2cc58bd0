"""EncoderLayer and Encoder as Keras citizens: Keras's own layer test harness (§3.1)."""

import keras
import numpy as np
from keras.src import testing

from keras_transformer.layers import Encoder, EncoderLayer


class EncoderLayerTest(testing.TestCase):
    def test_encoder_layer_passes_the_keras_layer_test(self):
        self.run_layer_test(
            EncoderLayer,
            init_kwargs={"num_heads": 2, "d_ff": 16, "dropout": 0.1},
            input_shape=(2, 5, 8),
            expected_output_shape=(2, 5, 8),
            # W^Q, W^K, W^V, W^O; W_1, b_1, W_2, b_2; two LayerNorms' gamma and beta
            expected_num_trainable_weights=4 + 4 + 4,
            supports_masking=True,
        )

    def test_encoder_passes_the_keras_layer_test(self):
        for norm_first in (False, True):
            self.run_layer_test(
                Encoder,
                init_kwargs={"num_layers": 2, "num_heads": 2, "d_ff": 16, "norm_first": norm_first},
                input_shape=(2, 5, 8),
                expected_output_shape=(2, 5, 8),
                expected_num_trainable_weights=2 * 12 + (2 if norm_first else 0),  # pre-LN: a final LayerNorm
                supports_masking=True,
            )

    def test_keras_mask_masks_padded_keys_and_passes_through(self):
        ids = np.array([[5, 6, 7, 0], [8, 9, 0, 0]])
        embedded = keras.layers.Embedding(10, 8, mask_zero=True)(ids)
        encoder = Encoder(num_layers=1, num_heads=2, d_ff=16)
        outputs = encoder(embedded)
        np.testing.assert_array_equal(np.asarray(outputs._keras_mask), ids != 0)
        np.testing.assert_allclose(outputs, encoder(embedded, padding_mask=ids != 0), atol=1e-6)
        _, weights = encoder.encode(embedded)
        assert float(keras.ops.max(weights[0][1, :, :, 2:])) == 0.0  # no attention to the padding
