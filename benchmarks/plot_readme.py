"""The README's performance chart from the benchmarks' JSON results.

Run the two benchmarks with `--json`, then:

    python benchmarks/plot_readme.py benchmarks/results/train_small.json \
        benchmarks/results/decode.json --output benchmarks/results/performance.png

One panel per file: each system's median rate with min–max whiskers (ours
in blue, peers in gray), as in the tables the benchmarks print.
"""

import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

TITLES = {
    "train_throughput": "Training, small shape, batch 64 x 32+32 tokens\n(target tokens/s)",
    "decode_throughput": "Beam 4, batch 32, 20 output tokens\n(generated tokens/s)",
}


def panel(ax, payload):
    results = [r for r in payload["results"] if not r.get("skipped") and r.get("seconds")]
    unit = "tokens" if "tokens" in results[0]["median"] else next(iter(results[0]["median"]))
    names = [r["name"] for r in results]
    medians = [r["median"][unit] for r in results]
    rates = [[amount[unit] / s for amount, s in zip(r["amounts"], r["seconds"])] for r in results]
    lows = [m - min(x) for m, x in zip(medians, rates)]
    highs = [max(x) - m for m, x in zip(medians, rates)]
    colors = ["tab:blue" if n.startswith("ours") else "tab:gray" for n in names]
    ax.barh(names, medians, xerr=[lows, highs], color=colors, capsize=3)
    ax.invert_yaxis()
    ax.set_title(TITLES.get(payload.get("benchmark"), payload.get("benchmark", "")), fontsize=10)
    for y, (m, high) in enumerate(zip(medians, highs)):
        ax.text(m + high, y, f"  {m:,.0f}", va="center", fontsize=8)
    ax.set_xlim(0, max(m + h for m, h in zip(medians, highs)) * 1.25)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="JSON files written by the benchmarks' --json")
    parser.add_argument("--output", required=True)
    args = parser.parse_args(argv)
    payloads = []
    for path in args.results:
        with open(path, encoding="utf-8") as f:
            payloads.append(json.load(f))
    rows = max(len(p["results"]) for p in payloads)
    fig, axes = plt.subplots(1, len(payloads), figsize=(6 * len(payloads), 0.45 * rows + 1.8), squeeze=False)
    for ax, payload in zip(axes[0], payloads):
        panel(ax, payload)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
