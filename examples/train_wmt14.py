"""The paper's WMT 2014 English→German recipe, on GPUs, with the same `train()`.

Vaswani et al. (2017), "Attention Is All You Need":

- §5.1 data: WMT 2014 English-German, ~4.5M sentence pairs, byte-pair
  encoding with a shared source-target vocabulary of ~37000 tokens; batches
  of ~25000 source and ~25000 target tokens, pairs batched by approximate
  length. Here: `tfds:wmt14_translate/de-en` (downloaded by TensorFlow
  Datasets on first use; a large download), a joint SentencePiece BPE
  vocabulary of 37000 (`spm.model`, trained once per run directory), and a
  global budget of 25000 tokens per side, split over the replicas. On
  fewer than 8 GPUs (`--gpus`, default the visible ones) each update
  accumulates ceil(8 / GPUs) batches of 25000 / ceil(8 / GPUs) tokens
  (`--accumulate-steps`, `training.accumulation`): the paper's batch, with
  at most its 3125 tokens on each GPU at a time.
- §5.2 hardware and schedule: one machine with 8 P100 GPUs; base models
  100,000 steps (~0.4 s/step, 12 hours), big models 300,000 steps (1.0
  s/step, 3.5 days). `keras_transformer.training.strategy.get_strategy()` picks
  MirroredStrategy over all local GPUs (or MultiWorkerMirroredStrategy when
  TF_CONFIG names a cluster); the loss is divided by the global token count,
  so the result does not depend on the number of GPUs.
- §5.3 optimizer: Adam(0.9, 0.98, 1e-9), learning rate
  d_model^-0.5 * min(step^-0.5, step * 4000^-1.5).
- §5.4 regularization: residual dropout 0.1 (0.3 for big EN-DE), label
  smoothing 0.1.
- §6.1 results: "For the base models, we used a single model obtained by
  averaging the last 5 checkpoints, which were written at 10-minute intervals.
  For the big models, we averaged the last 20 checkpoints. We used beam search
  with a beam size of 4 and length penalty alpha = 0.6 [...] maximum output
  length [...] input length + 50". Checkpoint intervals below are the paper's
  10 minutes at its step times (base ~1400 steps, big ~600 steps).
  Reported BLEU on newstest2014: 27.3 (base), 28.4 (big); tokenized,
  cased, with compound splitting, so above what sacreBLEU gives the same
  output.

Run (a machine with GPUs and network access for the tfds download):

    python examples/train_wmt14.py --recipe base --output runs/wmt14_base
    python examples/train_wmt14.py --recipe base --gpus 2 --dry-run   # 4 batches of 6250 tokens per update
    python examples/train_wmt14.py --recipe big --output runs/wmt14_big --precision mixed_float16
    python examples/train_wmt14.py --recipe base --dry-run      # print the configuration only
    python examples/train_wmt14.py --recipe base --output runs/wmt14_base --eval-only

The same run with the command line tool:

    keras-transformer train --data tfds:wmt14_translate/de-en --src en --tgt de --preset base \\
        --vocab-size 37000 --batch-tokens 25000 --max-steps 100000 --warmup-steps 4000 \\
        --checkpoint-every 1400 --average-last 5 --steps-per-epoch 1000 --output runs/wmt14_base

(on 8 GPUs; on 2, `--batch-tokens 6250 --accumulate-steps 4`).

Run the same command again after an interruption: training continues from
the last checkpoint (the streamed data is reshuffled, not replayed). After
training, the averaged model translates newstest2014 (vendored in
keras_transformer/data/newstest2014, 3003 sentences) and the scores are printed.
Mixed precision ("mixed_float16" on V100/T4, "mixed_bfloat16" on A100/H100)
and --xla are optional speed-ups the paper did not use.
"""

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer import training  # noqa: E402
from keras_transformer.cli import run_script  # noqa: E402
from keras_transformer.cli import train as train_cli  # noqa: E402

PAPER_GPUS = 8  # §5.2: "one machine with 8 NVIDIA P100 GPUs"
PAPER_BATCH_TOKENS = 25000  # §5.1, per side, over the 8 GPUs

COMMON = dict(
    data="tfds:wmt14_translate/de-en",
    src="en",
    tgt="de",
    vocab_size=37000,  # §5.1: shared BPE vocabulary of about 37000 tokens
    batch_tokens=PAPER_BATCH_TOKENS,  # §5.1: ~25000 source + ~25000 target tokens per batch
    max_length=256,
    validation_split="validation",  # newstest2013
    warmup_steps=4000,  # §5.3
    lr_scale=1.0,
    steps_per_epoch=1000,  # a history.csv row and a validation every 1000 steps
    keep_checkpoints=20,
    log_every=100,
    precision="float32",
)

RECIPES = {
    # Table 3 "base": N=6, d_model=512, h=8, d_ff=2048, P_drop=0.1; 100k steps (§5.2); average 5 (§6.1).
    "base": dict(
        COMMON, preset="base", output="runs/wmt14_en_de_base", max_steps=100_000, checkpoint_every=1400, average_last=5
    ),
    # Table 3 "big": N=6, d_model=1024, h=16, d_ff=4096, P_drop=0.3; 300k steps (§5.2); average 20 (§6.1).
    "big": dict(
        COMMON, preset="big", output="runs/wmt14_en_de_big", max_steps=300_000, checkpoint_every=600, average_last=20
    ),
}


def paper_batch(gpus):
    """`(batch_tokens, accumulate_steps)` that make the paper's batch on `gpus` GPUs (§5.1, §5.2).

    The 25000 tokens of an update come in ceil(8 / gpus) accumulated batches,
    so that no GPU holds more tokens at a time than each of the paper's 8.

    Example:
    >>> paper_batch(8), paper_batch(2), paper_batch(3)
    ((25000, 1), (6250, 4), (8333, 3))
    """
    steps = -(-PAPER_GPUS // gpus)
    return PAPER_BATCH_TOKENS // steps, steps


def visible_gpus():
    """The GPUs training will use (`training.strategy.get_strategy`), or the paper's 8 where there are none."""
    from keras_transformer import hardware

    return len(hardware.gpu_compute_capabilities()) or PAPER_GPUS


def build_parser(recipe, gpus=PAPER_GPUS):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--recipe", choices=sorted(RECIPES), default=recipe, help="the paper's base or big configuration (default base)"
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=gpus,
        help="GPUs to make the paper's batch on: fewer than 8 accumulate ceil(8 / GPUS) batches per update "
        "(--batch-tokens and --accumulate-steps, if given, win; default: the visible GPUs, 8 without any; "
        "with TF_CONFIG, give the cluster's total)",
    )
    batch_tokens, accumulate_steps = paper_batch(gpus)
    train_cli.add_training_arguments(
        parser, dict(RECIPES[recipe], batch_tokens=batch_tokens, accumulate_steps=accumulate_steps)
    )
    extra = parser.add_argument_group("evaluation")
    extra.add_argument("--dry-run", action="store_true", help="print the configuration and exit")
    extra.add_argument("--eval-only", action="store_true", help="only translate and score newstest2014")
    extra.add_argument("--eval-limit", type=int, default=None, help="score only the first N sentences")
    extra.add_argument("--beam", type=int, default=4, help="beam size (§6.1: 4)")
    extra.add_argument("--alpha", type=float, default=0.6, help="length penalty (§6.1: 0.6)")
    extra.add_argument("--eval-batch-size", type=int, default=128)
    return parser


def evaluate_newstest2014(run_dir, src, tgt, beam, alpha, batch_size, limit=None):
    """Translates newstest2014 with the run's final model (§6.1 decoding) and scores it."""
    from keras_transformer.data import corpora
    from keras_transformer.inference.evaluation import corpus_scores, format_scores
    from keras_transformer.inference.translator import Translator

    sources, references = corpora.read_newstest2014(src), corpora.read_newstest2014(tgt)
    if limit:
        sources, references = sources[:limit], references[:limit]
    translator = Translator.from_run_dir(run_dir, beam_size=beam, alpha=alpha, max_extra_length=50)
    started = time.perf_counter()
    hypotheses = translator.translate(sources, batch_size=batch_size, progress=True)
    scores = corpus_scores(hypotheses, references, lang=tgt)
    print(
        f"\nnewstest2014 {src}->{tgt}, {len(sources)} sentences "
        f"({time.perf_counter() - started:.0f} s to translate, beam {beam}, alpha {alpha}):"
    )
    print(format_scores(scores))
    print("Vaswani et al. (2017), Table 2: 27.3 (base), 28.4 (big), tokenized cased BLEU with compound splitting.")
    with open(os.path.join(run_dir, f"newstest2014.hyp.{tgt}"), "w", encoding="utf-8") as f:
        f.write("\n".join(hypotheses) + "\n")
    with open(os.path.join(run_dir, "newstest2014_scores.json"), "w", encoding="utf-8") as f:
        json.dump(scores, f, indent=2)
    return scores


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argparse.ArgumentParser(add_help=False)
    recipe.add_argument("--recipe", choices=sorted(RECIPES), default="base")
    recipe.add_argument("--gpus", type=int, default=None)
    known = recipe.parse_known_args(argv)[0]
    asks_help = {"-h", "--help"} & set(argv)  # answered without loading TensorFlow to count the GPUs
    gpus = known.gpus if known.gpus is not None else PAPER_GPUS if asks_help else visible_gpus()
    if gpus < 1:
        raise SystemExit(f"--gpus {gpus}: must be at least 1.")
    namespace = build_parser(known.recipe, gpus).parse_args(argv)
    chosen = namespace.recipe
    args = train_cli.args_from_namespace(namespace)

    if namespace.dry_run:
        config = args.model_config()
        print(json.dumps({"recipe": chosen, "model": config.to_dict(), "training": args.to_dict()}, indent=2))
        return args
    if namespace.eval_only:
        if not os.path.isdir(args.output):
            raise SystemExit(f"--eval-only: {args.output} is not a run directory (--output).")
    else:
        result = training.train(args)
        if result.stopped_on_nan:
            print("Training diverged (NaN loss); not evaluating.")
            return result
        if not result.is_chief:  # under MultiWorkerMirroredStrategy the chief evaluates
            return result
    return evaluate_newstest2014(
        args.output,
        args.src,
        args.tgt,
        namespace.beam,
        namespace.alpha,
        namespace.eval_batch_size,
        namespace.eval_limit,
    )


if __name__ == "__main__":
    run_script(lambda: 1 if getattr(main(), "stopped_on_nan", False) else 0, "train_wmt14.py")
