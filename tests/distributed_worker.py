"""Worker processes for tests/test_distributed.py (tf.distribute needs a fresh process).

python tests/distributed_worker.py mirrored RUN_DIR SPM_MODEL
    Two logical CPU devices. Trains the same tiny model (dropout 0) on the
    same global batches twice in this process, with a learning-rate
    cooldown over the last half: with MirroredStrategy over the two
    devices, then on one device. Prints one JSON line: the loss
    after every step of both runs, the per-replica target-token counts of
    the batches, and the largest weight difference at the end.

python tests/distributed_worker.py gradients RUN_DIR SPM_MODEL
    Two logical CPU devices. Trains one step of the same tiny model
    (dropout 0) with MirroredStrategy over the two devices, then on one
    device, with an optimizer that writes the gradient it applies into
    each weight (the sum over the replicas, as Keras gives it). Saves
    RUN_DIR/gradients.npz: those two gradients, the gradient of the mean
    loss over the global batch's real tokens taken with a tape on one
    device, and the batch's per-replica target-token counts.

TF_CONFIG=... python tests/distributed_worker.py multiworker RUN_DIR SPM_MODEL
    One worker of a MultiWorkerMirroredStrategy cluster (from TF_CONFIG).
    Trains a few steps; the run directory holds the final weights (the
    chief in RUN_DIR, worker i in RUN_DIR/worker-i). Prints one JSON line.

TF_CONFIG=... python tests/distributed_worker.py shards RUN_DIR SPM_MODEL
    One worker of a two-worker cluster. Distributes the training batches
    of two `fit` calls as `fit` does, with the corpus in memory and
    streamed, and prints one JSON line: for each, whether every local
    batch was this worker's half of the global batch the stream has at
    that step, and digests of the global and local batches.
"""

import json
import os
import shutil
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

TINY = dict(
    preset="tiny",
    vocab_size=500,
    batch_tokens=1024,
    max_length=32,
    validation_split=None,
    warmup_steps=4,
    lr_scale=1.0,
    checkpoint_every=1000,
    log_every=1000,
    verbose=0,
    seed=7,
    overrides={"dropout": 0.0, "num_layers": 1, "d_model": 32, "d_ff": 64},
)


def _prepare(run_dir, spm_model):
    os.makedirs(run_dir, exist_ok=True)
    shutil.copy(spm_model, os.path.join(run_dir, "spm.model"))  # skip training the vocabulary


def _two_cpu_devices():
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()]
    )
    devices = [d.name for d in tf.config.list_logical_devices("CPU")]
    assert len(devices) == 2, devices
    return devices


def mirrored(run_dir, spm_model, steps=6):
    devices = _two_cpu_devices()
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import training

    class Losses(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.losses = []

        def on_train_batch_end(self, batch, logs=None):
            self.losses.append(float(logs["loss"]))

    results = {}
    for name, strategy in (
        ("mirrored", tf.distribute.MirroredStrategy(devices)),
        ("one_device", tf.distribute.OneDeviceStrategy(devices[0])),
    ):
        directory = os.path.join(run_dir, name)
        _prepare(directory, spm_model)
        recorder = Losses()
        # The cooldown's factor (a variable of the optimizer's schedule, set between steps) must
        # reach both replicas: the last half of the steps runs at a lowered rate.
        args = training.TrainingArgs(output=directory, max_steps=steps, batch_multiple=2, cooldown=0.5, **TINY)
        result = training.train(args, callbacks=[recorder], strategy=strategy)
        results[name] = dict(
            replicas=strategy.num_replicas_in_sync,
            losses=recorder.losses,
            weights=[w.astype("float64") for w in result.model.get_weights()],
        )

    # The global batches both runs saw, and what each of the two replicas got.
    args = training.TrainingArgs(output=os.path.join(run_dir, "mirrored"), max_steps=steps, batch_multiple=2, **TINY)
    from keras_transformer import data
    from keras_transformer.data.tokenizer import Tokenizer

    tokenizer = Tokenizer(spm_model)
    from keras_transformer.training.stream import TrainingData

    stream = TrainingData(args, tokenizer, data.load_dataset("multi30k", "train"), 2, 32)
    per_epoch = stream.batches_per_epoch()
    replica_tokens = []
    for (_, _), labels in stream.stream(0, per_epoch).take(steps):
        labels = labels.numpy()
        half = labels.shape[0] // 2
        replica_tokens.append([int((labels[:half] != 0).sum()), int((labels[half:] != 0).sum())])
    max_weight_diff = max(
        float(np.max(np.abs(a - b))) for a, b in zip(results["mirrored"]["weights"], results["one_device"]["weights"])
    )
    print(
        json.dumps(
            dict(
                replicas={k: v["replicas"] for k, v in results.items()},
                mirrored=results["mirrored"]["losses"],
                one_device=results["one_device"]["losses"],
                replica_tokens=replica_tokens,
                max_weight_diff=max_weight_diff,
            )
        ),
        flush=True,
    )


def gradients(run_dir, spm_model):
    devices = _two_cpu_devices()
    import keras
    import numpy as np
    import tensorflow as tf

    from keras_transformer import data, training
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.losses import LabelSmoothedCrossEntropy
    from keras_transformer.model import Transformer
    from keras_transformer.training import loop
    from keras_transformer.training.stream import TrainingData

    class GradientCapture(keras.optimizers.Optimizer):
        """Writes the gradient it is given, after Keras's sum over the replicas, into the weight."""

        def update_step(self, gradient, variable, learning_rate):
            variable.assign(tf.convert_to_tensor(gradient))

    class Weights(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.before = [v.numpy() for v in self.model.trainable_variables]

        def on_train_end(self, logs=None):
            self.after = [v.numpy() for v in self.model.trainable_variables]

    loop.create_optimizer = lambda *args, **kwargs: GradientCapture(learning_rate=1.0)  # in strategy.scope()
    arrays = {}
    for name, strategy in (
        ("mirrored", tf.distribute.MirroredStrategy(devices)),
        ("one_device", tf.distribute.OneDeviceStrategy(devices[0])),
    ):
        directory = os.path.join(run_dir, name)
        _prepare(directory, spm_model)
        recorder = Weights()
        args = training.TrainingArgs(output=directory, max_steps=1, batch_multiple=2, **TINY)
        result = training.train(args, callbacks=[recorder], strategy=strategy)
        assert result.step == 1 and strategy.num_replicas_in_sync == {"mirrored": 2, "one_device": 1}[name]
        arrays.update({f"{name}_{i}": g for i, g in enumerate(recorder.after)})
        initial = recorder.before

    # The reference: the tape's gradient of the mean over the first global batch's real tokens.
    stream = TrainingData(args, Tokenizer(spm_model), data.load_dataset("multi30k", "train"), 2, 32)
    (inputs, labels) = next(iter(stream.stream(0, stream.batches_per_epoch())))
    model = Transformer(result.model.config)
    model.build()
    for variable, value in zip(model.trainable_variables, initial):
        variable.assign(value)
    with tf.GradientTape() as tape:
        loss = LabelSmoothedCrossEntropy(model.config.label_smoothing)(labels, model(inputs, training=True))
    reference = tape.gradient(loss, model.trainable_variables)
    arrays.update({f"reference_{i}": tf.convert_to_tensor(g).numpy() for i, g in enumerate(reference)})
    half = labels.shape[0] // 2
    arrays["replica_tokens"] = np.array([(labels[:half] != 0).numpy().sum(), (labels[half:] != 0).numpy().sum()])
    np.savez(os.path.join(run_dir, "gradients.npz"), **arrays)
    print(json.dumps(dict(variables=len(initial))), flush=True)


def multiworker(run_dir, spm_model, steps=4, **options):
    from keras_transformer import training
    from keras_transformer.training import strategy as distribute

    strategy = distribute.get_strategy()  # before anything else touches TensorFlow
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["index"] == 0:
        _prepare(run_dir, spm_model)
    else:
        os.makedirs(run_dir, exist_ok=True)
        if not os.path.exists(os.path.join(run_dir, "spm.model")):
            shutil.copy(spm_model, os.path.join(run_dir, "spm.model"))
    args = training.TrainingArgs(output=run_dir, max_steps=steps, **{**TINY, "checkpoint_every": 2, **options})
    result = training.train(args, strategy=strategy)
    print(
        json.dumps(
            dict(
                task=task,
                replicas=strategy.num_replicas_in_sync,
                step=result.step,
                run_dir=result.run_dir,
                is_chief=result.is_chief,
                rdrop_kl=result.history[-1].get("rdrop_kl"),
            )
        ),
        flush=True,
    )


def shards(run_dir, spm_model, steps=3):
    from keras_transformer.training import strategy as distribute

    strategy = distribute.get_strategy()  # before anything else touches TensorFlow
    import numpy as np

    from keras_transformer import data, training
    from keras_transformer.data.tokenizer import Tokenizer
    from keras_transformer.training.stream import TrainingData

    worker = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    args = training.TrainingArgs(output=run_dir, **TINY)
    tokenizer, text = Tokenizer(spm_model), data.load_dataset("multi30k", "train")

    def digest(labels):
        return int((labels.astype(np.int64) * (1 + np.arange(labels.size).reshape(labels.shape))).sum())

    report = {}
    for name, pool_limit in (("in_memory", data.MAX_DEFAULT_POOL_SIZE), ("streamed", 1000)):
        data.MAX_DEFAULT_POOL_SIZE = pool_limit  # below the corpus's 29,000 pairs: streamed
        training_data = TrainingData(args, tokenizer, text, strategy.num_replicas_in_sync, 32)
        assert training_data.streamed == (name == "streamed")
        expected = [labels.numpy() for _, labels in training_data.stream(0, 100).take(2 * steps)]
        local = []
        for first_step in (0, steps):  # two fit calls: the second goes on where the first stopped
            dataset = strategy.experimental_distribute_dataset(training_data.batches(first_step, 100, count=steps))
            for _, labels in dataset:
                (labels,) = strategy.experimental_local_results(labels)
                local.append(labels.numpy())
        halves = [np.split(labels, 2)[worker] for labels in expected]
        report[name] = dict(
            own_half=[a.shape == b.shape and bool(np.array_equal(a, b)) for a, b in zip(local, halves)],
            global_digests=[digest(labels) for labels in expected],
            local_digests=[digest(labels) for labels in local],
        )
    print(json.dumps(dict(worker=worker, replicas=strategy.num_replicas_in_sync, **report)), flush=True)


if __name__ == "__main__":
    mode, run_dir, spm_model = sys.argv[1:4]
    modes = {
        "mirrored": mirrored,
        "gradients": gradients,
        "multiworker": multiworker,
        "multiworker_rdrop": lambda *a: multiworker(
            *a, rdrop_alpha=5.0, overrides={**TINY["overrides"], "dropout": 0.3}
        ),
        "shards": shards,
    }
    modes[mode](run_dir, spm_model)
