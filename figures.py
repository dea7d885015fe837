"""
Figures: loss against steps and against wall-clock seconds, side by side, saved as a PNG. plot_run draws one run's
training and validation loss from its metrics.jsonl; runs_figure draws many runs' validation loss in one figure;
tensorboard gives a running run's records to TensorBoard (--tensorboard). matplotlib and tensorboard are optional:
_pyplot() is None without matplotlib, and a caller that needs a figure checks that first. Optional reading.
"""
import os
import statistics

from cli import log
from files import atomic_file
from rundir import metrics_records


def _pyplot():  # matplotlib's pyplot drawing to files only (no window, no display needed), or None if not installed
    os.environ["MPLBACKEND"] = "Agg"  # a user's MPLBACKEND that matplotlib does not know fails its import
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, png, title):  # written whole or not at all; the title is also the PNG's Title field
    with atomic_file(png) as f:
        fig.savefig(f, format="png", metadata={"Title": title})
    plt.close(fig)


def plot_run(metrics_path, png, title=""):
    """--plot: a run's metrics.jsonl drawn as its training and validation loss."""
    plt = _pyplot()
    rows = [e for _, e in metrics_records(metrics_path) if e]
    tr, va = [r for r in rows if "loss" in r], [r for r in rows if "val_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, key, label in ((axes[0], "step", "step"), (axes[1], "time", "wall-clock seconds")):
        style = "o" if len(tr) == 1 else "-"  # a line through one point draws nothing: a short run's one loss
        ax.plot([r[key] for r in tr], [r["loss"] for r in tr], style, label="train")
        ax.plot([r[key] for r in va], [r["val_loss"] for r in va], "o-", label="validation")
        ax.set(xlabel=label, ylabel="loss (nats/token)")
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    _save(plt, fig, png, title)
    log(f"plot: {png}")


def draw_runs(title, results, unigram):
    """Runs' validation curves [(step, seconds, loss)]: each against steps and against seconds, a run marked
    "baseline" dashed black above the others, a diverged run's last point marked x, the unigram baseline dotted.
    The y-axis ends a little above where most runs start (their median first loss, or the unigram baseline): a run
    far above (without RMSNorm the first loss is twice the others') would squeeze every other curve into a sliver;
    the figure names the runs it cuts."""
    plt = _pyplot()
    results = [r for r in results if r["curve"]]  # a run that diverged before its first finite loss has no curve
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharey=True)
    for ax, x, label in ((axes[0], 0, "step"), (axes[1], 1, "wall-clock seconds")):
        for r in results:
            style = dict(color="black", ls="--", lw=2, zorder=3) if r.get("baseline") else dict(zorder=2)
            named = r["name"] + (" (baseline)" if r.get("baseline") and r["name"] != "baseline" else "")
            line, = ax.plot([c[x] for c in r["curve"]], [c[2] for c in r["curve"]], marker="o", ms=3, label=named,
                            **style)
            if r["diverged"]:
                last = r["curve"][-1]
                ax.plot(r["diverged"] if x == 0 else last[1], last[2], "x", ms=12, mew=3, color=line.get_color(),
                        zorder=style["zorder"], label=f"{r['name']} diverged at step {r['diverged']}")
        ax.axhline(unigram, ls=":", color="gray", label="unigram baseline")
        ax.set(xlabel=label, ylabel="validation loss (nats/token)")
    top = max(statistics.median([r["curve"][0][2] for r in results] or [unigram]), unigram) * 1.05
    cut = [f"{r['name']} (up to {high:.1f})" for r in results if (high := max(c[2] for c in r["curve"])) > top]
    # the unigram baseline is in the legend, so in sight too: runs that all stayed above it (diverged, or short)
    axes[0].set_ylim(min(unigram, *(c[2] for r in results for c in r["curve"])) * 0.95, top)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    if cut:
        fig.text(0.5, 0.01, f"y-axis clipped at {top:.2f}: {', '.join(cut)} run above it", ha="center", fontsize=8)
    fig.tight_layout(rect=(0, 0.03 if cut else 0, 1, 1))
    return fig


def runs_figure(title, results, unigram, png):
    """draw_runs's figure as png. Returns False without matplotlib."""
    plt = _pyplot()
    if plt is None:
        return False
    _save(plt, draw_runs(title, results, unigram), png, title)
    return True


_writers = {}  # run directory -> its TensorBoard SummaryWriter, made at the run's first record


def tensorboard(cfg, run_dir, entry):
    """--tensorboard: one metrics.jsonl record as scalars in RUN_DIR/tensorboard/ (tensorboard --logdir OUT_DIR).
    A resumed run's first record purges the events a stopped run wrote from that step on, as metrics.jsonl drops
    its lines; flushed at each record (log steps only), so a killed run's curve is there up to its last line."""
    if not cfg["tensorboard"]:
        return
    if run_dir not in _writers:  # CHECKS made sure the package is there
        from torch.utils.tensorboard import SummaryWriter
        _writers[run_dir] = SummaryWriter(run_dir / "tensorboard", purge_step=entry["step"])
    writer = _writers[run_dir]
    for key, value in entry.items():
        if key != "step" and isinstance(value, (int, float)):
            writer.add_scalar(key, value, entry["step"])
    writer.flush()
