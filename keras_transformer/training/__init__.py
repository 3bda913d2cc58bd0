"""Training with `model.fit` under `tf.distribute`: resumable, observable, reproducible.

The paper's training (Vaswani et al., 2017, §5):

- §5.1 batches of ~25000 source and ~25000 target tokens, sentence pairs
  batched by approximate length (`keras_transformer.data.make_batches`);
- §5.2 one machine with 8 GPUs: here the strategy of `strategy.get_strategy()`
  (one device, MirroredStrategy over the local GPUs, or
  MultiWorkerMirroredStrategy from `TF_CONFIG`), the global batch split over
  the replicas and the loss divided by the global token count, so N replicas
  train exactly like one device;
- §5.3 Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the schedule of
  equation (3) with warmup_steps = 4000 (`--warmup-steps`, `--lr-scale`);
- §5.4 residual dropout P_drop = 0.1 and label smoothing epsilon_ls = 0.1;
- §6.1 averaging the last 5 (base) or 20 (big) checkpoints:
  `--checkpoint-every`, `--average-last K`, `average_checkpoints`;
  `--average-fraction F` keeps the average within the run's last F of steps.

Modules:

- `options`: `TrainingArgs`, `TrainingResult`.
- `strategy`: the distribution strategy, chief and workers (the precision: `keras_transformer.hardware`).
- `stream`: the training batches as a deterministic, resumable stream.
- `run`: one process's run directory, checkpoints, backup and logs.
- `lock`: one training process per run directory.
- `inputs`: the data files checked before anything is written; the
  vocabulary tied to the data it was learned on.
- `callbacks`: progress, checkpoints, time budget, CSV and TensorBoard logs.
- `accumulation`: gradient accumulation, one update from `accumulate_steps`
  batches (the paper's batch of §5.1 on fewer devices).
- `rdrop`: R-Drop's loss, two dropout masks per batch (`--rdrop-alpha`; not in the paper).
- `averaging`: checkpoint averaging (§6.1).
- `curves`: `curves.png`.
- `loop`: `train()`, in named phases.

The run directory's layout is in `keras_transformer.run_dir`. An "epoch"
(Keras `fit` epoch, one `history.csv` row) is one pass over an in-memory
training set: each pass is a new seeded permutation of the pairs, batched by
`make_batches` in whole batches only (each length bucket's leftover pairs
join the next longer bucket; `data.whole_batches`), so every pass has the
same number of batches. For streamed corpora (tfds, and
text files of more than `data.MAX_DEFAULT_POOL_SIZE` pairs) an epoch is
`--steps-per-epoch` steps (default 1000 for tfds).

Under MultiWorkerMirroredStrategy the chief writes the run directory and
worker i writes the same layout into `RUN_DIR/worker-i/`; every worker
resumes from the chief's `backup/` (a shared file system) or else its own.

Python API: `TrainingArgs`, `train(args)` -> `TrainingResult`,
`average_checkpoints(paths)`, `write_averaged_model`, `load_run(run_dir)`.
Command line: `keras-transformer train ...` and
`keras-transformer average-checkpoints RUN_DIR --last K`.
"""

from keras_transformer.lazy import lazy_exports

# Public names and the module that defines each. They are loaded on first
# use, so that `keras_transformer.training.options` (which the command line
# reads for its flags) does not pull in TensorFlow Text, matplotlib and the loop.
_EXPORTS = {
    "PRECISIONS": "keras_transformer.training.options",
    "PRECISION_CHOICES": "keras_transformer.training.options",
    "TrainingArgs": "keras_transformer.training.options",
    "TrainingResult": "keras_transformer.training.options",
    "average_checkpoints": "keras_transformer.training.averaging",
    "checkpoints_to_average": "keras_transformer.training.averaging",
    "write_averaged_model": "keras_transformer.training.averaging",
    "count_batches_per_epoch": "keras_transformer.training.stream",
    "list_checkpoints": "keras_transformer.run_dir",
    "load_run": "keras_transformer.run_dir",
    "plot_curves": "keras_transformer.training.curves",
    "train": "keras_transformer.training.loop",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
