"""`curves.png`: the training and validation curves of a run directory (matplotlib)."""

from __future__ import annotations

import math
import os

from keras_transformer.run_dir import CURVES_FILENAME, HISTORY_FILENAME, STEPS_FILENAME, read_csv


def _float(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def plot_curves(run_dir, output=None):
    """Plots training (every `log_every` steps) and validation (every epoch) loss and accuracy
    against the step into `output` (default `RUN_DIR/curves.png`), in the format its extension
    names (.png, .pdf, .svg, ...). Returns the path, or None without data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backend_bases import FigureCanvasBase

    output = os.fspath(output) if output else os.path.join(run_dir, CURVES_FILENAME)
    image_format = os.path.splitext(output)[1][1:].lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if image_format not in formats:
        raise ValueError(
            f"plot_curves: cannot write {output}: .{image_format} is not an image format matplotlib "
            f"writes ({', '.join('.' + f for f in sorted(formats))})."
        )
    steps = read_csv(os.path.join(run_dir, STEPS_FILENAME))
    epochs = read_csv(os.path.join(run_dir, HISTORY_FILENAME))
    if not steps and not epochs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, title in ((axes[0], "loss", "label-smoothed cross-entropy"), (axes[1], "accuracy", "token accuracy")):
        xs = [_float(r.get("step")) for r in steps]
        ys = [_float(r.get(key)) for r in steps]
        points = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
        if points:
            ax.plot(*zip(*points), label="train (mean of each --log-every steps)", color="tab:blue", linewidth=1)
        for prefix, label, style in (
            ("", "train (epoch mean)", dict(color="tab:blue", marker="o", linestyle="none", alpha=0.5)),
            ("val_", "validation", dict(color="tab:orange", marker="o")),
        ):
            pts = [(_float(r.get("step")), _float(r.get(prefix + key))) for r in epochs]
            pts = [(x, y) for x, y in pts if x is not None and y is not None]
            if pts:
                ax.plot(*zip(*pts), label=label, **style)
        ax.set_xlabel("step")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(os.path.basename(os.path.abspath(run_dir)))
    fig.tight_layout()
    tmp = output + f".tmp-{os.getpid()}"
    try:
        fig.savefig(tmp, dpi=100, format=image_format)  # the temporary name's extension must not choose it
    finally:
        plt.close(fig)
    os.replace(tmp, output)
    return output
