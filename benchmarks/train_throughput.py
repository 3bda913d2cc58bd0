"""Training throughput: our Transformer against keras-hub and torch.nn.Transformer, one process.

Workload (`--shape small`, the default): 3+3 layers, d_model 256, 4 heads,
d_ff 1024, shared vocabulary of 8000, dropout 0.1, label smoothing 0.1;
batches of 64 sentence pairs x 32 source + 32 target tokens of synthetic
random ids (no padding by default; `--padding random` pads each sentence to a
random length in [len/2, len]). `--shape base` is the paper's base model
(6+6, 512, 8 heads, 2048), ours against keras-hub by default.

Systems, each in float32 ("fp32") and mixed bfloat16 ("bf16"):

* ours: the normal user path, `keras.mixed_precision.set_global_policy(...)`,
  `Transformer(TransformerConfig.small(8000))`, `model.compile()` (Adam +
  warmup schedule, label smoothing 0.1, MaskedAccuracy), `model.fit(...)`.
* keras-hub: `TokenAndPositionEmbedding` (one instance for source and target,
  learned positions, tied output projection via `reverse=True`) +
  `TransformerEncoder` / `TransformerDecoder` stacks of the same shape and
  dropout, `SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)`
  (keras' sparse CE has no label smoothing), `SparseCategoricalAccuracy`,
  the same Adam + schedule, `model.fit(...)`.
* torch: `torch.nn.Transformer` (post-LN, relu, batch_first) with one shared
  `nn.Embedding` (x sqrt(d_model), sinusoids, tied output projection),
  `CrossEntropyLoss(label_smoothing=0.1, ignore_index=0)`, Adam + the same
  schedule, a plain eager training loop; bf16 = `torch.autocast("cpu",
  torch.bfloat16)`; `torch.set_num_threads(2)`.

Every system is warmed up (graphs traced), then timed runs of `--steps`
training steps alternate between systems for `--repeats` rounds; the table
gives medians of target tokens per second (non-padding target tokens).

FLOP utilization. Training FLOPs per target token are computed from the
shapes (matmuls only; forward x 3 for forward + backward):

    forward per sentence pair (N layers per stack, S source, T target tokens):
      encoder:   N * S * 2 * (4 d^2 + 2 d d_ff)                     projections + FFN
               + N * 4 S^2 d                                         Q K^T and A V
      decoder:   N * T * 2 * (4 d^2 + 2 d^2 + 2 d d_ff)             self-attn, cross Q/O, FFN
               + N * S * 2 * 2 d^2                                   cross-attention K, V of the memory
               + N * (4 T^2 d + 4 T S d)                             self and cross Q K^T, A V
      output:    T * 2 d V                                           pre-softmax projection
    training FLOP / target token = 3 * forward / T

i.e. about 6 x (matmul parameters touched per target token) plus the
attention terms: 46.2 MFLOP for the small shape at S = T = 32. The same
number is used for every system (same shapes; biases, norms, softmax, loss
and optimizer are not counted). The roof is measured in the same process: a
TensorFlow matmul of 1024x1024 by 1024x1024 in float32 and in bfloat16 (and
a model-shaped 2048x256 by 256x1024 one), GFLOP/s = 2 m k n / time. Utilization
= achieved model GFLOP/s / roof of the run's precision.

Usage:

    .venv/bin/python benchmarks/train_throughput.py                      # full: ~5 min
    .venv/bin/python benchmarks/train_throughput.py --steps 3 --repeats 1 --only ours   # seconds
    .venv/bin/python benchmarks/train_throughput.py --shape base --steps 5
    .venv/bin/python benchmarks/train_throughput.py --json out/train.json --plot out/train.png
    .venv/bin/python benchmarks/train_throughput.py --profile /tmp/prof   # top TF ops of ours (bf16)
"""

from __future__ import annotations

import argparse
import glob
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import common  # noqa: E402

common.quiet_tensorflow()

import numpy as np  # noqa: E402

PAD, BOS = 0, 2

SHAPES = {
    "small": dict(num_layers=3, d_model=256, num_heads=4, d_ff=1024),
    "base": dict(num_layers=6, d_model=512, num_heads=8, d_ff=2048),
}
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


# Workload ----------------------------------------------------------------------------


def make_batches(num_batches, batch_size, source_length, target_length, vocab_size, padding, seed=0):
    """Synthetic ((source, target_in), target_out) int32 batches; 0 = padding."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(num_batches):
        source = rng.integers(4, vocab_size, size=(batch_size, source_length), dtype=np.int32)
        target = rng.integers(4, vocab_size, size=(batch_size, target_length + 1), dtype=np.int32)
        target[:, 0] = BOS
        if padding == "random":
            source_lengths = rng.integers(source_length // 2, source_length + 1, size=batch_size)
            target_lengths = rng.integers(target_length // 2, target_length + 1, size=batch_size)
            source[np.arange(source_length)[None, :] >= source_lengths[:, None]] = PAD
            # target_in has BOS + length-1 tokens, target_out the length tokens.
            target[np.arange(target_length + 1)[None, :] > target_lengths[:, None]] = PAD
        batches.append((source, target[:, :-1].copy(), target[:, 1:].copy()))
    return batches


def tokens_in(batches, steps):
    """Non-padding target tokens of the first `steps` batches of the cycle."""
    return int(sum(np.count_nonzero(batches[i % len(batches)][2]) for i in range(steps)))


def train_flops_per_target_token(num_layers, d_model, d_ff, vocab_size, source_length, target_length, **_):
    """Matmul FLOPs of one training step (forward x 3) per target token; see the module docstring."""
    n, d, f, v, s, t = num_layers, d_model, d_ff, vocab_size, source_length, target_length
    encoder = n * s * 2 * (4 * d * d + 2 * d * f) + n * 4 * s * s * d
    decoder = n * t * 2 * (6 * d * d + 2 * d * f) + n * s * 2 * 2 * d * d + n * (4 * t * t * d + 4 * t * s * d)
    output = t * 2 * d * v
    return 3.0 * (encoder + decoder + output) / t


def keras_dataset(batches):
    import tensorflow as tf

    sources = np.stack([b[0] for b in batches])
    targets_in = np.stack([b[1] for b in batches])
    targets_out = np.stack([b[2] for b in batches])
    dataset = tf.data.Dataset.from_tensor_slices(((sources, targets_in), targets_out))
    # No tf.data autotuning: every timed `fit` call starts a fresh iterator, and with
    # autotuning on, `fit` returned only at the autotuner's next wake-up, 10 * (2^k - 1) ms
    # after the start (runs took 2.56 s, 5.12 s or 10.23 s whatever the work).
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.repeat().prefetch(2).with_options(options)


def keras_fit(model, dataset, steps):
    model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, shuffle=False)


def keras_runner(model, batches, steps, policy):
    dataset = keras_dataset(batches)
    amount = tokens_in(batches, steps)

    def run():
        with common.policy_scope(policy):
            keras_fit(model, dataset, steps)
        return {"tokens": amount}

    return run


# Systems -----------------------------------------------------------------------------


def ours_system(args, precision, batches):
    policy = POLICIES[precision]

    def setup():
        from keras_transformer import Transformer, TransformerConfig

        with common.policy_scope(policy):
            config = TransformerConfig.from_preset(args.shape, args.vocab_size, dropout=args.dropout)
            model = Transformer(config)
            model.compile()
            keras_fit(model, keras_dataset(batches), args.warmup_steps)
        return keras_runner(model, batches, args.steps, policy)

    return common.System(
        f"ours {precision}",
        setup,
        baseline=f"ours {precision}",
        info={"policy": policy, "path": "Transformer + compile() + fit()"},
    )


class KerasHubSeq2Seq:
    """Factory for the keras-hub peer (a keras.Model subclass built on first use)."""

    @staticmethod
    def build(vocab_size, max_length, num_layers, d_model, num_heads, d_ff, dropout):
        import keras
        import keras_hub
        from keras import ops

        class Seq2Seq(keras.Model):
            def __init__(self, **kwargs):
                super().__init__(**kwargs)
                self.embedding = keras_hub.layers.TokenAndPositionEmbedding(
                    vocab_size, max_length, d_model, tie_weights=True, dtype=self.dtype_policy, name="embedding"
                )
                self.source_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
                self.target_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
                self.encoder_layers = [
                    keras_hub.layers.TransformerEncoder(
                        d_ff, num_heads, dropout=dropout, dtype=self.dtype_policy, name=f"encoder_{i}"
                    )
                    for i in range(num_layers)
                ]
                self.decoder_layers = [
                    keras_hub.layers.TransformerDecoder(
                        d_ff, num_heads, dropout=dropout, dtype=self.dtype_policy, name=f"decoder_{i}"
                    )
                    for i in range(num_layers)
                ]
                self.num_layers, self.num_heads, self.d_model = num_layers, num_heads, d_model

            def encode(self, source_ids, training=None):
                x = self.source_dropout(self.embedding(source_ids), training=training)
                mask = ops.not_equal(source_ids, 0)
                for layer in self.encoder_layers:
                    x = layer(x, padding_mask=mask, training=training)
                return x

            def logits(self, y):
                return ops.cast(self.embedding.token_embedding(y, reverse=True), "float32")

            def call(self, inputs, training=None):
                source_ids, target_ids = inputs
                memory = self.encode(source_ids, training=training)
                y = self.target_dropout(self.embedding(target_ids), training=training)
                for layer in self.decoder_layers:
                    y = layer(
                        y,
                        memory,
                        decoder_padding_mask=ops.not_equal(target_ids, 0),
                        encoder_padding_mask=ops.not_equal(source_ids, 0),
                        training=training,
                    )
                return self.logits(y)

        return Seq2Seq(name="keras_hub_seq2seq")


def keras_hub_system(args, precision, batches):
    policy = POLICIES[precision]

    def setup():
        try:
            import keras_hub  # noqa: F401
        except ImportError:
            raise common.Skip("keras-hub is not installed (pip install -e '.[bench]')") from None
        import keras

        from keras_transformer import TransformerSchedule

        shape = SHAPES[args.shape]
        with common.policy_scope(policy):
            model = KerasHubSeq2Seq.build(args.vocab_size, 256, dropout=args.dropout, **shape)
            model.compile(
                # What a keras-hub user has: Keras' Adam, with the paper's settings.
                optimizer=keras.optimizers.Adam(TransformerSchedule(shape["d_model"]), 0.9, 0.98, 1e-9),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=PAD),
                metrics=[keras.metrics.SparseCategoricalAccuracy()],
            )
            keras_fit(model, keras_dataset(batches), args.warmup_steps)
        return keras_runner(model, batches, args.steps, policy)

    return common.System(f"keras-hub {precision}", setup, baseline=f"ours {precision}", info={"policy": policy})


def torch_system(args, precision, batches):
    def setup():
        try:
            import torch
        except ImportError:
            raise common.Skip("torch is not installed (pip install -e '.[bench]')") from None
        from torch import nn

        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        shape = SHAPES[args.shape]
        d, vocab = shape["d_model"], args.vocab_size

        class Seq2Seq(nn.Module):
            def __init__(self):
                super().__init__()
                self.embedding = nn.Embedding(vocab, d)
                nn.init.normal_(self.embedding.weight, std=d**-0.5)
                position = torch.arange(256, dtype=torch.float32)[:, None]
                inverse = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
                table = torch.zeros(256, d)
                table[:, 0::2], table[:, 1::2] = torch.sin(position * inverse), torch.cos(position * inverse)
                self.register_buffer("positions", table)
                self.dropout = nn.Dropout(args.dropout)
                self.transformer = nn.Transformer(
                    d_model=d,
                    nhead=shape["num_heads"],
                    num_encoder_layers=shape["num_layers"],
                    num_decoder_layers=shape["num_layers"],
                    dim_feedforward=shape["d_ff"],
                    dropout=args.dropout,
                    batch_first=True,
                )

            def embed(self, ids):
                return self.dropout(self.embedding(ids) * math.sqrt(d) + self.positions[: ids.shape[1]])

            def forward(self, source, target):
                length = target.shape[1]
                causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
                source_pad, target_pad = source.eq(PAD), target.eq(PAD)
                y = self.transformer(
                    self.embed(source),
                    self.embed(target),
                    tgt_mask=causal,
                    tgt_is_causal=True,
                    src_key_padding_mask=source_pad,
                    tgt_key_padding_mask=target_pad,
                    memory_key_padding_mask=source_pad,
                )
                return nn.functional.linear(y, self.embedding.weight)

        model = Seq2Seq()
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: d**-0.5 * min((step + 1) ** -0.5, (step + 1) * 4000**-1.5)
        )
        loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=PAD)
        tensors = [tuple(torch.from_numpy(a.astype(np.int64)) for a in b) for b in batches]
        bf16 = precision == "bf16"

        def train_steps(steps):
            loss = None
            for i in range(steps):
                source, target_in, target_out = tensors[i % len(tensors)]
                optimizer.zero_grad(set_to_none=True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(source, target_in)
                loss = loss_fn(logits.float().reshape(-1, vocab), target_out.reshape(-1))
                loss.backward()
                optimizer.step()
                schedule.step()
            return float(loss.detach())

        train_steps(args.warmup_steps)
        amount = tokens_in(batches, args.steps)

        def run():
            train_steps(args.steps)
            return {"tokens": amount}

        return run

    return common.System(
        f"torch {precision}",
        setup,
        baseline=f"ours {precision}",
        info={"autocast": "bfloat16" if precision == "bf16" else None, "threads": args.threads},
    )


# Matmul roof -------------------------------------------------------------------------


def matmul_gflops(m, k, n, dtype, repeats=7, inner=10):
    """Median GFLOP/s of a TensorFlow [m, k] x [k, n] matmul (`inner` per timed call)."""
    import time

    import tensorflow as tf

    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((inner, m, k)).astype(np.float32) / math.sqrt(k), dtype=dtype)
    b = tf.constant(rng.standard_normal((k, n)).astype(np.float32) / math.sqrt(k), dtype=dtype)

    @tf.function
    def product(a, b):
        total = tf.constant(0.0, tf.float32)
        for i in range(inner):  # unrolled: `inner` independent 2-D matmuls
            total += tf.cast(tf.reduce_sum(tf.matmul(a[i], b)[:1, :1]), tf.float32)
        return total

    product(a, b).numpy()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b).numpy()
        times.append(time.perf_counter() - start)
    return 2.0 * m * k * n * inner / common.median(times) / 1e9


def measure_roof():
    import tensorflow as tf

    roof = {}
    for precision, dtype in (("fp32", tf.float32), ("bf16", tf.bfloat16)):
        roof[precision] = {
            "square_1024": matmul_gflops(1024, 1024, 1024, dtype),
            "model_2048x256x1024": matmul_gflops(2048, 256, 1024, dtype),
        }
        common.log(f"[roof] {precision}: " + ", ".join(f"{k} {v:.1f} GFLOP/s" for k, v in roof[precision].items()))
    return roof


# Profile -----------------------------------------------------------------------------


def profile_ours(args, batches):
    """Traces `--profile-steps` steps of ours with the TF profiler and prints the top ops by self time."""
    import tensorflow as tf

    from keras_transformer import Transformer, TransformerConfig

    precision = args.profile_precision
    policy = POLICIES[precision]
    with common.policy_scope(policy):
        model = Transformer(TransformerConfig.from_preset(args.shape, args.vocab_size, dropout=args.dropout))
        model.compile()
        dataset = keras_dataset(batches)
        keras_fit(model, dataset, args.warmup_steps)
        tf.profiler.experimental.start(args.profile)
        keras_fit(model, dataset, args.profile_steps)
        tf.profiler.experimental.stop()
    paths = sorted(glob.glob(os.path.join(args.profile, "plugins", "profile", "*", "*.xplane.pb")))
    if not paths:
        common.log("no .xplane.pb written")
        return
    by_type, by_name, total = top_ops(paths[-1])
    print(f"\n### Profile: ours {precision}, {args.shape} shape, {args.profile_steps} steps ({paths[-1]})\n")
    print(
        f"Self time of TensorFlow ops on the host threads, all threads summed: {total / 1e12:.2f} s "
        f"for {args.profile_steps} steps.\n"
    )
    rows = [(t, f"{s / 1e9:,.1f}", f"{100 * s / total:.1f}%", c) for t, (s, c) in by_type[: args.profile_top]]
    print(common.markdown_table(["op type", "self ms", "share", "count"], rows))
    print()
    rows = [(n[:110], f"{s / 1e9:,.1f}", f"{100 * s / total:.1f}%", c) for n, (s, c) in by_name[: args.profile_top]]
    print(common.markdown_table(["op (name:type)", "self ms", "share", "count"], rows))


def top_ops(xplane_path):
    """Aggregates TF op events of an XSpace by self time: `(by_type, by_name, total_ps)`."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    with open(xplane_path, "rb") as f:
        space.ParseFromString(f.read())
    by_type, by_name, total = {}, {}, 0
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        metadata = plane.event_metadata
        for line in plane.lines:
            events = sorted(line.events, key=lambda e: (e.offset_ps, -e.duration_ps))
            # Self time: duration minus the time of the events nested directly inside.
            stack, self_time = [], {}
            for index, event in enumerate(events):
                while stack and events[stack[-1]].offset_ps + events[stack[-1]].duration_ps <= event.offset_ps:
                    stack.pop()
                if stack:
                    self_time[stack[-1]] -= event.duration_ps
                self_time[index] = event.duration_ps
                stack.append(index)
            for index, event in enumerate(events):
                name = metadata[event.metadata_id].name
                # TF ops are "name:Type" (oneDNN kernels "name:_MklMatMul", ...); skip runtime
                # events such as "ExecutorState::Process" or "KernelAndDeviceFunc::Run".
                if ":" not in name or "::" in name:
                    continue
                op_type = name.rsplit(":", 1)[1]
                if not op_type or not (op_type[0].isupper() or op_type.startswith("_")):
                    continue
                self_ps = max(self_time[index], 0)
                total += self_ps
                for table, key in ((by_type, op_type), (by_name, name)):
                    entry = table.setdefault(key, [0, 0])
                    entry[0] += self_ps
                    entry[1] += 1
    order = lambda table: sorted(((k, tuple(v)) for k, v in table.items()), key=lambda kv: -kv[1][0])  # noqa: E731
    return order(by_type), order(by_name), max(total, 1)


# Main --------------------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--steps", type=int, default=20, help="training steps per timed run")
    parser.add_argument("--warmup-steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds; medians over them")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--source-length", type=int, default=32)
    parser.add_argument("--target-length", type=int, default=32)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--padding", choices=["none", "random"], default="none")
    parser.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated name prefixes, e.g. 'ours' or 'ours,torch bf16' "
        "(default: all; for --shape base: ours, keras-hub)",
    )
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--no-roof", action="store_true", help="skip the matmul roof measurement")
    parser.add_argument("--json", default=None, help="write results to this JSON file")
    parser.add_argument("--plot", default=None, help="write a bar chart PNG (matplotlib)")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="instead of benchmarking, trace ours with the TF profiler into DIR and print top ops",
    )
    parser.add_argument("--profile-precision", choices=sorted(POLICIES), default="bf16")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--profile-top", type=int, default=15)
    args = parser.parse_args(argv)

    batches = make_batches(8, args.batch_size, args.source_length, args.target_length, args.vocab_size, args.padding)
    if args.profile:
        profile_ours(args, batches)
        return

    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    systems = []
    for precision in precisions:
        systems.append(ours_system(args, precision, batches))
        systems.append(keras_hub_system(args, precision, batches))
        systems.append(torch_system(args, precision, batches))
    only = args.only if args.only is not None or args.shape == "small" else "ours,keras-hub"
    systems = common.select(systems, only)

    machine = common.machine_info()
    common.log(f"load average at start: {machine['load_average_at_start']}")
    roof = None if args.no_roof else measure_roof()
    results = common.run_alternating(systems, args.repeats)
    machine["load_average_at_end"] = common.load_average()
    if roof is not None:
        roof_after = measure_roof()
        roof = {p: {k: max(v, roof_after[p][k]) for k, v in roof[p].items()} for p in roof}

    shape = dict(
        SHAPES[args.shape],
        vocab_size=args.vocab_size,
        source_length=args.source_length,
        target_length=args.target_length,
    )
    flops_per_token = train_flops_per_target_token(**shape)
    ratios = common.ratio_to_baseline(results, "tokens")
    headers = [
        "system",
        "target tok/s (median)",
        "min–max",
        "× ours",
        "ms/step",
        "model GFLOP/s",
        "% of matmul roof",
        "setup s",
        "+RSS MiB",
        "peak RSS MiB",
    ]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.name, f"skipped: {r.skipped}"] + [""] * (len(headers) - 2))
            continue
        rate = r.median_rate("tokens")
        rates = r.rates("tokens")
        gflops = rate * flops_per_token / 1e9
        precision = r.name.rsplit(" ", 1)[-1]
        utilization = (100 * gflops / roof[precision]["square_1024"]) if roof else float("nan")
        step_ms = 1000 * common.median([s / args.steps for s in r.seconds])
        rows.append(
            [
                r.name,
                common.fmt(rate),
                f"{min(rates):,.0f}–{max(rates):,.0f}",
                common.fmt(ratios[r.name], ".2f"),
                common.fmt(step_ms, ".0f"),
                common.fmt(gflops, ".1f"),
                common.fmt(utilization, ".1f"),
                common.fmt(r.setup_seconds, ".1f"),
                common.fmt(r.setup_rss_mb),
                common.fmt(r.peak_rss_mb),
            ]
        )

    versions = common.package_versions(["tensorflow", "keras", "keras-hub", "torch", "numpy"])
    print(
        f"\n### Training throughput, {args.shape} shape ({shape['num_layers']}+{shape['num_layers']} layers, "
        f"d_model {shape['d_model']}, {shape['num_heads']} heads, d_ff {shape['d_ff']}, vocab {args.vocab_size})\n"
    )
    print(
        f"Batch {args.batch_size} x {args.source_length} source + {args.target_length} target tokens, "
        f"padding: {args.padding}; {args.steps} steps per run, {args.repeats} alternating rounds, "
        f"median shown. × ours = system / ours of the same precision.\n"
    )
    print(common.markdown_table(headers, rows))
    print(f"\nModel FLOP per target token (training, matmuls): {flops_per_token / 1e6:.1f} MFLOP.")
    if roof:
        print(
            "Matmul roof (TF, same process, best of before/after): "
            + "; ".join(
                f"{p} {v['square_1024']:.1f} GFLOP/s (1024^3), {v['model_2048x256x1024']:.1f} (2048x256x1024)"
                for p, v in roof.items()
            )
        )
    print(
        f"Peak RSS of the process: {common.process_peak_rss_mb():,.0f} MiB. "
        f"Load average: start {machine['load_average_at_start']}, end {machine['load_average_at_end']}; "
        f"{machine.get('cpu', '?')}, {machine['cpu_count']} CPUs."
    )
    print("Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v))

    common.write_json(
        args.json,
        {
            "benchmark": "train_throughput",
            "args": vars(args),
            "shape": shape,
            "flops_per_target_token": flops_per_token,
            "matmul_roof_gflops": roof,
            "machine": machine,
            "versions": versions,
            "results": common.results_payload(results, ["tokens"]),
        },
    )
    common.plot_bars(args.plot, results, "tokens", f"Training throughput ({args.shape}), target tokens/s")


if __name__ == "__main__":
    main()
