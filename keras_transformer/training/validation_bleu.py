"""BLEU on the validation set during training, the best checkpoint, and early stopping on it.

The loss says how well the model predicts the next token with the reference
prefix given; BLEU says how well it translates. Every `--validate-bleu-every`
steps (and at the last step) the live model translates the validation
sources (greedy or beam search, batched, in the graph: the same `Translator`
as inference) and the cased sacreBLEU against the references is

- printed, with the best so far;
- written to `bleu.csv` (step, BLEU, seconds) and to TensorBoard
  (`logs/validation_bleu`), and the latest value goes into `history.csv`'s
  `val_bleu` column at the end of each epoch;
- with `--keep-best`, the weights of the best validation BLEU are written to
  `checkpoints/best.weights.h5` (with `best.json`: step and BLEU), which the
  checkpoint rotation never deletes;
- with `--early-stopping-patience K`, training stops (with a checkpoint)
  after K validations in a row without a better BLEU.

A resumed run takes the best BLEU and the validations without improvement
so far from the rows of `bleu.csv` up to its resume step.

The decoding time counts against `--time-budget`, but not into tokens/s.
"""

from __future__ import annotations

import csv
import json
import os
import time

from keras_transformer.run_dir import BLEU_FILENAME, CHECKPOINT_DIR, LOG_DIR, atomic_write_text, save_model_weights

BEST_WEIGHTS_FILENAME = "best.weights.h5"
BEST_INFO_FILENAME = "best.json"
SEARCHES = ("greedy", "beam")


def read_validation_texts(dataset):
    """`(sources, references)` lists of str from a `(source_text, target_text)` dataset."""
    sources, references = [], []
    for source_batch, target_batch in dataset.batch(65536).as_numpy_iterator():
        sources.extend(s.decode("utf-8") for s in source_batch)
        references.extend(t.decode("utf-8") for t in target_batch)
    if not sources:
        raise ValueError("The validation split is empty: there is nothing to compute BLEU on.")
    return sources, references


class ValidationBleu:
    """Translates the validation sources with the live model and keeps score; see the module docstring.

    Args:
        run: the training `Run` (paths, chief or not).
        tokenizer: the run's `Tokenizer`.
        sources, references: the validation split, as lists of str.
        every: steps between validations.
        search: "greedy" or "beam" (beam 4, alpha 0.6, §6.1).
        keep_best: write the best weights to `checkpoints/best.weights.h5`.
        patience: stop after this many validations without improvement (None: never).
        lang: target language (for the tokenized BLEU's Moses tokenizer).
        start_step: the step a resumed run starts from: the best, the latest
            and the validations without improvement so far are those of the
            rows of `bleu.csv` up to it (None: all its rows).
    """

    def __init__(
        self,
        run,
        tokenizer,
        sources,
        references,
        every,
        search="greedy",
        keep_best=False,
        patience=None,
        lang="de",
        start_step=None,
    ):
        if search not in SEARCHES:
            raise ValueError(f"search must be one of {', '.join(SEARCHES)}, got {search!r}.")
        self.run = run
        self.tokenizer = tokenizer
        self.sources, self.references = sources, references
        self.every = every
        self.search = search
        self.keep_best = keep_best
        self.patience = patience
        self.lang = lang
        self.best = None  # (step, bleu)
        self.latest = None  # (step, bleu)
        self.without_improvement = 0
        for step, bleu in self._read_scores(start_step):
            self._count(step, bleu)
        self._translator = None
        self._writer = None

    def due(self, previous_step, step, last):
        """Whether to validate after `step`: every `every` steps, and at the last step."""
        crossed = step // self.every > previous_step // self.every
        return crossed or (last and (self.latest is None or self.latest[0] != step))

    def __call__(self, model, step):
        """Validates the weights of `step`; returns True when early stopping says to stop."""
        from keras_transformer.inference.evaluation import corpus_scores

        started = time.perf_counter()
        hypotheses = self._translator_for(model).translate(self.sources)
        bleu = corpus_scores(hypotheses, self.references, lang=self.lang)["bleu"]
        seconds = time.perf_counter() - started
        if self._count(step, bleu) and self.keep_best:
            self._save_best(model, step, bleu)
        self._log(step, bleu, seconds)
        stop = self.patience is not None and self.without_improvement >= self.patience
        if stop:
            print(
                f"Early stopping at step {step}: no better validation BLEU in {self.patience} validations "
                f"(best {self.best[1]:.2f} at step {self.best[0]}).",
                flush=True,
            )
        return stop

    def _count(self, step, bleu):
        """Takes the BLEU of `step` into the latest, the best and the count without improvement; True if best."""
        self.latest = (step, bleu)
        improved = self.best is None or bleu > self.best[1]
        if improved:
            self.best = (step, bleu)
            self.without_improvement = 0
        else:
            self.without_improvement += 1
        return improved

    def _translator_for(self, model):
        if self._translator is None or self._translator.model is not model:
            from keras_transformer.inference.translator import Translator

            self._translator = Translator(model, self.tokenizer, beam_size=1 if self.search == "greedy" else 4)
        return self._translator

    def _save_best(self, model, step, bleu):
        directory = self.run.path(CHECKPOINT_DIR)
        save_model_weights(model, os.path.join(directory, BEST_WEIGHTS_FILENAME))
        atomic_write_text(
            os.path.join(directory, BEST_INFO_FILENAME),
            json.dumps({"step": step, "bleu": bleu, "search": self.search}, indent=2),
        )

    def _read_scores(self, start_step):
        """`(step, bleu)` of the rows of `bleu.csv` up to `start_step` (None: all), in order.

        Only the chief writes `bleu.csv`: the other workers read its file, so
        that early stopping stops them all at the same step.
        """
        path = self.run.path(BLEU_FILENAME) if self.run.is_chief else os.path.join(self.run.run_dir, BLEU_FILENAME)
        if not os.path.exists(path):
            return []
        scores = []
        with open(path, newline="", encoding="utf-8") as f:
            for row in csv.DictReader(f):
                try:
                    step, bleu = int(row["step"]), float(row["bleu"])
                except (KeyError, TypeError, ValueError):
                    continue  # a row cut short by a killed process
                if start_step is None or step <= start_step:
                    scores.append((step, bleu))
        return scores

    def _log(self, step, bleu, seconds):
        best_step, best_bleu = self.best
        print(
            f"\nstep {step}: validation BLEU {bleu:.2f} ({self.search}, {len(self.sources)} sentences, "
            f"{seconds:.0f} s); best {best_bleu:.2f} at step {best_step}",
            flush=True,
        )
        if not self.run.is_chief:
            return
        path = self.run.path(BLEU_FILENAME)
        new = not os.path.exists(path)
        with open(path, "a", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(["step", "bleu", "seconds"])
            writer.writerow([step, round(bleu, 4), round(seconds, 1)])
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.run.path(LOG_DIR, "validation_bleu"))
        with self._writer.as_default():
            tf.summary.scalar("bleu", bleu, step=step)
        self._writer.flush()
