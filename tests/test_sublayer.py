"""SublayerConnection as a Keras citizen: Keras's own layer test harness (§3.1, §5.4)."""

import numpy as np
from keras.src import testing

from keras_transformer.layers import SublayerConnection


class SublayerConnectionLayerTest(testing.TestCase):
    def test_passes_the_keras_layer_test(self):
        for norm_first in (False, True):
            self.run_layer_test(
                SublayerConnection,
                init_kwargs={"dropout": 0.1, "norm_first": norm_first},
                input_shape=(2, 5, 8),
                call_kwargs={"sublayer_output": np.ones((2, 5, 8), "float32")},
                expected_output_shape=(2, 5, 8),
                expected_num_trainable_weights=2,  # the LayerNorm's gamma and beta
                supports_masking=True,
                # The harness's training model and its mixed-precision spec pass no `sublayer_output`.
                run_training_check=False,
                run_mixed_precision_check=False,
            )
