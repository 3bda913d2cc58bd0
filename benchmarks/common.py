"""Shared helpers of the throughput benchmarks: alternating timed runs, medians, tables, RSS.

The benchmarks compare systems (ours and peers) on one workload in one
process. Every system is first set up and warmed up (graphs traced, XLA
compiled, threads spun up); then the timed runs alternate, system after
system, for `repeats` rounds, each round starting one system later:

    round 1: ours, peer A, peer B
    round 2: peer A, peer B, ours
    round 3: peer B, ours, peer A
    ...

so a slow phase of the machine (other jobs, thermal state) hits every system
alike, and each system's result is the median of its runs.

A `System` is a name plus a `setup()` that returns a `run()` callable; `run()`
does one timed unit of work and returns the amounts done, e.g.
`{"tokens": 2048}`. `setup()` raises `Skip` when the peer is not installed.

Memory: `ru_maxrss` (`resource.getrusage`) is the peak resident set of the
whole process and only grows, so with several systems in one process it
cannot tell them apart. On Linux the peak (VmHWM) can be reset
(`/proc/self/clear_refs`), so each system's row reports the highest resident
set of the process *while that system was set up or running* (the other
systems' models are resident too: compare rows by their difference, or look
at "+RSS", the resident memory its setup added). The reset also resets
`ru_maxrss`, so the process-wide peak is tracked here
(`process_peak_rss_mb`) and reported once. Where the reset is not allowed,
the rows show `ru_maxrss` after the system's runs instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quiet_tensorflow():
    """Call before importing TensorFlow: no C++ info logs, package importable from a checkout."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)


class Skip(Exception):
    """Raised by a `System.setup` that cannot run here (a peer is not installed)."""


@dataclasses.dataclass
class System:
    """One contender.

    Attributes:
        name: row label, e.g. "ours fp32".
        setup: builds and warms up; returns `run() -> {unit: amount}`.
        baseline: name of the system its ratio is computed against (None: itself).
        info: free-form details printed under the table and kept in the JSON.
    """

    name: str
    setup: Callable[[], Callable[[], dict[str, float]]]
    baseline: str | None = None
    info: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Result:
    name: str
    baseline: str | None
    info: dict
    setup_seconds: float = 0.0
    setup_rss_mb: float = 0.0
    peak_rss_mb: float = 0.0
    seconds: list[float] = dataclasses.field(default_factory=list)
    amounts: list[dict[str, float]] = dataclasses.field(default_factory=list)
    skipped: str | None = None

    def rates(self, unit):
        return [a[unit] / s for a, s in zip(self.amounts, self.seconds) if s > 0]

    def median_rate(self, unit):
        rates = self.rates(unit)
        return statistics.median(rates) if rates else float("nan")


# Memory ------------------------------------------------------------------------------


def peak_rss_mb():
    """Peak resident set size of this process so far, in MiB (`ru_maxrss` is KiB on Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024.0 * 1024.0) if sys.platform == "darwin" else peak / 1024.0


_PEAK_SEEN_MB = 0.0


def process_peak_rss_mb():
    """Peak RSS of the whole process so far, across `reset_peak_rss` calls, in MiB."""
    return max(_PEAK_SEEN_MB, window_peak_rss_mb(), peak_rss_mb())


def reset_peak_rss():
    """Resets the process's peak RSS (VmHWM, and with it ru_maxrss) on Linux; False where not possible."""
    global _PEAK_SEEN_MB
    _PEAK_SEEN_MB = max(_PEAK_SEEN_MB, window_peak_rss_mb(), peak_rss_mb())
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def window_peak_rss_mb():
    """VmHWM (peak RSS since the last `reset_peak_rss`) in MiB; `peak_rss_mb()` where unavailable."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except (OSError, ValueError, IndexError):
        pass
    return peak_rss_mb()


def current_rss_mb():
    """Current resident set size in MiB (Linux; falls back to the peak elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


# Machine -----------------------------------------------------------------------------


def load_average():
    try:
        return list(os.getloadavg())
    except OSError:
        return [float("nan")] * 3


def machine_info():
    from keras_transformer.hardware import cpu_identity

    info = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": load_average(),
    }
    info.update(cpu_identity())
    return info


def cpu_vendor(cpuinfo_path="/proc/cpuinfo"):
    """`/proc/cpuinfo`'s vendor_id (GenuineIntel, AuthenticAMD), or None."""
    from keras_transformer.hardware import cpuinfo_value

    return cpuinfo_value("vendor_id", cpuinfo_path)


def package_versions(names):
    from importlib import metadata

    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# Running -----------------------------------------------------------------------------


def log(message):
    print(message, file=sys.stderr, flush=True)


def json_from_process(command, label, env=None):
    """Runs `command`, a worker that prints its result as a JSON line last, in a fresh process: that result.

    Raises:
        RuntimeError: the worker failed or printed no JSON line; the message
            names `label` and ends with the worker's last stderr.
    """
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{label} failed (exit {completed.returncode}):\n{completed.stderr[-2000:]}")
    return json.loads(lines[-1])


def run_alternating(systems: list[System], repeats: int) -> list[Result]:
    """Sets up every system, then times `repeats` rounds of alternating runs.

    Each round starts one system later than the one before (A B C, B C A,
    C A B, ...), so no system always runs first, or always right after the
    same other system, on a machine whose speed drifts.
    """
    results, runners = [], []
    for system in systems:
        result = Result(system.name, system.baseline, dict(system.info))
        results.append(result)
        gc.collect()
        rss_before = current_rss_mb()
        reset_peak_rss()
        start = time.perf_counter()
        log(f"[setup] {system.name} ...")
        try:
            runner = system.setup()
        except Skip as skip:
            result.skipped = str(skip)
            log(f"[skip] {system.name}: {skip}")
            runners.append(None)
            continue
        result.setup_seconds = time.perf_counter() - start
        result.info = dict(system.info)  # setup may have added details (e.g. a conversion check)
        result.setup_rss_mb = current_rss_mb() - rss_before
        result.peak_rss_mb = window_peak_rss_mb()
        log(f"[setup] {system.name}: {result.setup_seconds:.1f} s, +{result.setup_rss_mb:.0f} MiB resident")
        runners.append(runner)

    for round_index in range(repeats):
        shift = round_index % max(len(systems), 1)
        for result, runner in list(zip(results, runners))[shift:] + list(zip(results, runners))[:shift]:
            if runner is None:
                continue
            gc.collect()
            reset_peak_rss()
            start = time.perf_counter()
            amounts = runner()
            seconds = time.perf_counter() - start
            result.seconds.append(seconds)
            result.amounts.append(dict(amounts))
            result.peak_rss_mb = max(result.peak_rss_mb, window_peak_rss_mb())
            rate = ", ".join(f"{v / seconds:,.1f} {k}/s" for k, v in amounts.items())
            log(f"[run {round_index + 1}/{repeats}] {result.name}: {seconds:.2f} s, {rate}")
    return results


def median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


# Reporting ---------------------------------------------------------------------------


def paired_ratios(results: list[Result], baseline: str, unit: str = "tokens"):
    """`{name: median over rounds of (its rate / the baseline's rate in the same round)}`.

    Runs alternate, so a round's runs share the machine's state of that moment; their ratio cancels its drift.
    """
    base = next(r for r in results if r.name == baseline)
    ratios = {}
    for r in results:
        pairs = [(a[unit] / s) / (b[unit] / t) for a, s, b, t in zip(r.amounts, r.seconds, base.amounts, base.seconds)]
        ratios[r.name] = median(pairs)
    return ratios


def ratio_to_baseline(results: list[Result], unit: str):
    """`{name: median rate / median rate of its baseline}` (NaN if the baseline did not run)."""
    by_name = {r.name: r for r in results}
    ratios = {}
    for r in results:
        base = by_name.get(r.baseline or r.name)
        if r.skipped or base is None or base.skipped:
            ratios[r.name] = float("nan")
        else:
            ratios[r.name] = r.median_rate(unit) / base.median_rate(unit)
    return ratios


def fmt(value, spec=",.0f"):
    if value is None or (isinstance(value, float) and value != value):
        return "–"
    return format(value, spec)


def markdown_table(headers, rows):
    """A GitHub Markdown table; numbers already formatted as strings."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(str(cell) for cell in row) + " |")
    return "\n".join(lines)


def results_payload(results: list[Result], units: list[str]):
    payload = []
    ratios = {unit: ratio_to_baseline(results, unit) for unit in units}
    for r in results:
        entry = dataclasses.asdict(r)
        entry["median"] = {unit: r.median_rate(unit) for unit in units}
        entry["ratio_to_baseline"] = {unit: ratios[unit][r.name] for unit in units}
        payload.append(entry)
    return payload


def cpu_flags(cpuinfo_path="/proc/cpuinfo"):
    """The CPU features that decide which precision is fast here (what a figure's machine is named by)."""
    from keras_transformer.hardware import cpu_flags as all_flags

    return sorted(all_flags(cpuinfo_path) & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "avx512_vnni"})


def results_folder(cpuinfo_path="/proc/cpuinfo"):
    """The folder under benchmarks/results for this machine's figures, named as the committed ones are.

    Intel CPUs by their fast precision: "avx512_bf16" (where most of the AMX
    Xeon's figures are; `intel_xeon_amx` holds one written to an explicit
    `--json` path) or "avx2". AMD CPUs by generation where precision does not
    tell them apart: "amd_epyc_zen5" for family 26 (Zen 5, which trains the
    demo ~1.8x as fast as the earlier AVX512_BF16 EPYC, whose figures are in
    "amd_epyc_avx512_bf16"), else "amd_epyc_avx512_bf16" or "amd_epyc_avx2"
    ("amd_..." for a CPU not named EPYC).
    """
    from keras_transformer.hardware import cpu_identity

    precision = "avx512_bf16" if "avx512_bf16" in cpu_flags(cpuinfo_path) else "avx2"
    if cpu_vendor(cpuinfo_path) != "AuthenticAMD":
        return precision
    identity = cpu_identity(cpuinfo_path)
    prefix = "amd_epyc" if "EPYC" in identity.get("cpu", "") else "amd"
    return f"{prefix}_zen5" if identity.get("cpu_family") == 26 else f"{prefix}_{precision}"


# Environment variables that choose the kernels a run measures; the command shows those that are set.
KERNEL_VARIABLES = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "CT2_USE_MKL")


def command_line(argv=None, environ=None):
    """The command that reproduces this run, prefixed by the kernel-choosing variables set in `environ`."""
    argv = sys.argv if argv is None else argv
    environ = os.environ if environ is None else environ
    script = os.path.relpath(os.path.abspath(argv[0]), ROOT) if argv and argv[0] else "?"
    settings = [f"{name}={shlex.quote(environ[name])}" for name in KERNEL_VARIABLES if name in environ]
    return " ".join(settings + ["python", script] + [shlex.quote(a) for a in argv[1:]])


def code_version(root=None):
    """The commit the run measured, with "+dirty" when tracked files differ from it; None outside git."""
    root = ROOT if root is None else root
    try:

        def git(*args):
            command = ["git", "-C", root, *args]
            return subprocess.run(command, capture_output=True, text=True, check=True, timeout=30).stdout.strip()

        commit = git("rev-parse", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if changed else "")


def provenance():
    """How a results file was made: the command line, the code's commit, the date, the CPU flags and the load when
    it was written."""
    return {
        "command": command_line(),
        "commit": code_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpu_flags": cpu_flags(),
        "load_average_at_write": load_average(),
    }


def write_json(path, payload):
    """Writes `payload` with its provenance (command, date, CPU flags, load; the payload's own keys win)."""
    if not path:
        return
    payload = {**provenance(), **payload}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    log(f"wrote {path}")


def plot_bars(path, results: list[Result], unit, title):
    """Horizontal bar chart of median rates with min–max whiskers (needs matplotlib)."""
    if not path:
        return
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: no plot")
        return
    ran = [r for r in results if not r.skipped and r.seconds]
    if not ran:
        return
    names = [r.name for r in ran]
    medians = [r.median_rate(unit) for r in ran]
    lows = [m - min(r.rates(unit)) for m, r in zip(medians, ran)]
    highs = [max(r.rates(unit)) - m for m, r in zip(medians, ran)]
    colors = ["tab:blue" if r.name.startswith("ours") else "tab:gray" for r in ran]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ran) + 1.5))
    ax.barh(names, medians, xerr=[lows, highs], color=colors, capsize=3)
    ax.invert_yaxis()
    ax.set_xlabel(f"{unit}/s (median, whiskers: min–max)")
    ax.set_title(title)
    for y, m in enumerate(medians):
        ax.text(m, y, f" {m:,.0f}", va="center")
    fig.tight_layout()
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    log(f"wrote {path}")


def select(systems: list[System], only: str | None):
    """Keeps the systems whose name starts with one of the comma-separated prefixes in `only`."""
    if not only:
        return systems
    prefixes = [p.strip() for p in only.split(",") if p.strip()]
    kept = [s for s in systems if any(s.name.startswith(p) for p in prefixes)]
    if not kept:
        names = ", ".join(s.name for s in systems)
        raise SystemExit(f"--only {only!r} matches none of: {names}")
    return kept


@contextlib.contextmanager
def policy_scope(policy):
    """Sets the Keras global dtype policy inside the block, restoring the previous one after."""
    import keras

    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(policy)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)
