"""
Training curves of run folders, read from their metrics.jsonl (`python probe.py plot RUN... --png=curves.png`):

- question-answer runs (Fig. 3): k-hop accuracy of test_id, test_ood and val_id, and Stage-1 accuracy of the training
  questions, against epochs; tables of the last evaluation, the first crossings of 0.8 and 0.9 and the Stage-1 route,
  and, with a stop_metric, where train.py's early stopping would have ended each run;
- token-shard runs: validation and training loss against tokens (config.json gives the tokens per iteration).

Every problem with a folder (no metrics.jsonl, no evaluation up to at_epoch, an unreadable config.json) is one
DataError naming it, raised before a figure is drawn.
"""
import json
import os

from discoloop.common import ConfigError, DataError, table
from discoloop.ownership import FIGURE_METADATA
from model import RECURRENCES
from discoloop.runlog import early_stop_row, read_metrics


def save_figure(fig, png, dpi):
    """Every figure the project draws: with the mark (ownership.owned), its folder made now (an output's folder is
    proven writable before the work, common.check_writable, and made only when written)."""
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    fig.savefig(png, dpi=dpi, metadata=FIGURE_METADATA)

FIGURE_EXTENSIONS = (".png", ".pdf", ".svg")  # what --png may end with: formats matplotlib writes from the suffix


def figure_path(path):
    """A figure path matplotlib writes by its suffix (a .txt used to fail after the work, with a traceback); whether a
    file already there may be replaced is ownership.owned's (only a figure this project drew: its metadata's mark)."""
    return path == "" or path.lower().endswith(FIGURE_EXTENSIONS)


def epoch_of(m):
    """A row's x coordinate: its epoch (question-answer runs), else its iteration (token-shard runs)."""
    return m.get("epoch", m["iter"])


def read_runs(dirs, at_epoch=-1):
    """{run folder: its metrics rows up to at_epoch (-1: all)}, each log read once."""
    seen = set()
    for d in dirs:
        if os.path.realpath(d) in seen:
            raise ConfigError(f"run folder '{d}' is given twice")
        seen.add(os.path.realpath(d))
    logs = {}
    for d in dirs:
        path = os.path.join(d, "metrics.jsonl")
        if not os.path.isfile(path):
            raise DataError(f"no metrics.jsonl in '{d}'")
        rows = read_metrics(path)
        logs[d] = [m for m in rows if at_epoch < 0 or epoch_of(m) <= at_epoch]
        if not logs[d]:
            raise DataError(f"'{d}' has no evaluation in its metrics.jsonl" if not rows else
                            f"'{d}' has no evaluation at or before at_epoch={at_epoch:g} (its first is at "
                            f"{epoch_of(rows[0])}): allowed -1 (the whole run) or an epoch >= {epoch_of(rows[0])}")
    return logs


def run_config(d, required=False):
    """A run folder's config.json as a dict ({} when absent and not required); DataError when it cannot be read."""
    path = os.path.join(d, "config.json")
    if not os.path.isfile(path):
        if required:
            raise DataError(f"no config.json in '{d}': a token-shard run's tokens per iteration "
                            "(batch_size x gradient_accumulation_steps x block_size) come from it")
        return {}
    try:
        with open(path) as f:
            c = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"'{path}' cannot be read as JSON ({type(e).__name__}): a damaged run folder?") from None
    if not isinstance(c, dict):
        raise DataError(f"'{path}' is not a run's config (a JSON object)")
    return c


def run_labels(dirs):
    """{folder: label}: the folder's name, or the path as given where two runs share a name."""
    names = [os.path.basename(os.path.normpath(d)) for d in dirs]
    return {d: n if names.count(n) == 1 else os.path.normpath(d) for d, n in zip(dirs, names)}


def plot(dirs, png, stop_metric="", stop_patience=10, at_epoch=-1, hops=2):
    """probe.py plot: the figure at `png` and the tables; returns {run label: summary} (probe_plot's JSON)."""
    logs = read_runs(dirs, at_epoch)
    import matplotlib  # here, not at the top: probe.py's other commands need no matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if all(any("val_loss" in m for m in ms) for ms in logs.values()):
        return plot_pretraining(logs, png, plt)
    return plot_qa(logs, png, plt, stop_metric, stop_patience, hops)


def plot_qa(logs, png, plt, stop_metric, stop_patience, hops):
    """Fig. 3 for question-answer runs: k-hop accuracy (left) and Stage-1 accuracy (right) against epochs."""
    sfx = "" if hops == 2 else f"_{hops}hop"  # the split names of k-hop questions (data/symbolic/prepare.py)
    for d, ms in logs.items():
        if not any(f"acc/test_id{sfx}" in m for m in ms):
            raise DataError(f"hops={hops}: '{d}' has no test_id{sfx} accuracy in its metrics (trained on other hops?)")
    flat = {d: RECURRENCES.get(run_config(d).get("recurrence"), RECURRENCES["loop"]).copies for d in logs}
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    out, labels = {}, run_labels(list(logs))
    for i, (d, ms) in enumerate(logs.items()):
        out[labels[d]] = draw_qa_run(ax1, ax2, ms, labels[d], f"C{i}", flat[d], sfx, stop_metric, stop_patience)
    ax1.set(xlabel="epoch", ylabel=f"{hops}-hop accuracy", ylim=(0, 1.02),
            title="test_id (solid), test_ood (dashed), val_id (dotted)" + (", | = stop" if stop_metric else ""))
    ax2.set(xlabel="epoch", ylabel=f"Stage-1 train {hops}-hop accuracy", ylim=(0, 1.02), title="Stage-1 (head after loop 1)")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, 110)
    print_qa_tables(out, sfx, hops, stop_metric, stop_patience)
    print(f"wrote {png}")
    return out


def draw_qa_run(ax1, ax2, ms, label, color, flat, sfx, stop_metric, stop_patience):
    """One run's curves; returns its summary: the last row, the first crossings and, with a stop_metric, the row
    where a run with that early-stopping rule ends (the same run's prefix)."""
    x = [epoch_of(m) for m in ms]
    for split, ls in (("test_id", "-"), ("test_ood", "--"), ("val_id", ":")):
        if any(f"acc/{split}{sfx}" in m for m in ms):
            ax1.plot(x, [m.get(f"acc/{split}{sfx}", float("nan")) for m in ms], ls=ls, color=color,
                     label=label if split == "test_id" else None)
    stage1 = f"acc/train_id{sfx}" if flat else f"acc1/train_id{sfx}"  # the flat model has no Stage 1: its final accuracy
    ax2.plot(x, [m.get(stage1, float("nan")) for m in ms], color=color, label=label + (" (final)" if flat else ""))
    summary = {"last": ms[-1], "first": first_crossings(ms, sfx)}
    if stop_metric:
        i = early_stop_row(ms, stop_metric, stop_patience)
        summary["stop"] = ms[i] if i is not None else None
        if i is not None:
            ax1.axvline(x[i], color=color, lw=0.8, alpha=0.6)
    return summary


def print_qa_tables(out, sfx, hops, stop_metric, stop_patience):
    print(f"{hops}-hop splits:")
    print(table(["run", "epoch", "minutes", "CPU minutes", f"test_id{sfx}", f"test_ood{sfx}", f"Stage-1 train_id{sfx}",
                 "best test_ood", "ID>=.8", "ID>=.9", "OOD>=.8", "OOD>=.9", "Stage-1 peak (epoch)", "Stage-1 < .05 from"],
                [[k, v["last"].get("epoch"), round(v["last"]["time"] / 60, 1) if "time" in v["last"] else "-",  # a hand-made row may lack it
                  round(v["last"]["cpu_time"] / 60, 1) if "cpu_time" in v["last"] else "-",
                  v["last"].get(f"acc/test_id{sfx}"), v["last"].get(f"acc/test_ood{sfx}"),
                  v["last"].get(f"acc1/train_id{sfx}"), v["first"]["best_ood"]]
                 + [v["first"][f"{s}>={t}"] for s in ("test_id", "test_ood") for t in (0.8, 0.9)]
                 + [v["first"]["stage1_peak"], v["first"]["stage1_collapse"]]
                 for k, v in out.items()]))
    print("(crossings: first evaluation at or above the threshold, as 'epoch (minutes; CPU minutes)'; the Stage-1 columns "
          "show the route: a collapse after the peak = composition across loops)")
    if stop_metric:
        print(f"\nwith stop_metric={stop_metric!r}, stop_patience={stop_patience}: the run ends at")
        print(table(["run", "epoch", stop_metric, "acc/val_id", "test_id", "test_ood", "Stage-1 train_id"],
                    [[k] + ([v["stop"].get("epoch"), v["stop"][stop_metric], v["stop"].get("acc/val_id"),
                             v["stop"].get("acc/test_id"), v["stop"].get("acc/test_ood"), v["stop"].get("acc1/train_id")]
                            if v["stop"] else ["(not stopped)"] + [""] * 5) for k, v in out.items()]))


def tokens_per_iter(d):
    """batch_size x gradient_accumulation_steps x block_size from a token-shard run's config.json."""
    c = run_config(d, required=True)
    keys = ("batch_size", "gradient_accumulation_steps", "block_size")
    if not all(type(c.get(k)) is int and c[k] >= 1 for k in keys):
        raise DataError(f"'{os.path.join(d, 'config.json')}' lacks a positive integer {' / '.join(keys)}: "
                        "not a training run's config")
    return c["batch_size"] * c["gradient_accumulation_steps"] * c["block_size"]


def plot_pretraining(logs, png, plt):
    """Validation and training loss against tokens, for token-shard runs (no QA splits); logs: {run folder: rows}."""
    per_iter = {d: tokens_per_iter(d) for d in logs}  # every folder checked before the figure
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    out, labels = {}, run_labels(list(logs))
    for i, (d, ms) in enumerate(logs.items()):
        v = [m for m in ms if "val_loss" in m]
        t = [m for m in ms if "loss" in m]
        ax1.plot([m["iter"] * per_iter[d] / 1e6 for m in v], [m["val_loss"] for m in v], color=f"C{i}", label=labels[d])
        ax2.plot([m["iter"] * per_iter[d] / 1e6 for m in t], [m["loss"] for m in t], color=f"C{i}", label=labels[d])
        out[labels[d]] = {"iter": v[-1]["iter"], "tokens": v[-1]["iter"] * per_iter[d], "val_loss": v[-1]["val_loss"],
                          "best_val_loss": min(m["val_loss"] for m in v), "minutes": round(v[-1]["time"] / 60, 1) if "time" in v[-1] else None}
    ax1.set(xlabel="tokens (M)", ylabel="validation loss", title="validation loss")
    ax2.set(xlabel="tokens (M)", ylabel="training loss (logged)", title="training loss")
    for ax in (ax1, ax2):
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, 110)
    print(table(["run", "iterations", "tokens", "minutes", "last val_loss", "best val_loss"],
                [[k, v["iter"], f"{v['tokens']:,}", v["minutes"], v["val_loss"], v["best_val_loss"]]
                 for k, v in out.items()]))
    print(f"wrote {png}")
    return out


def first_crossings(ms, sfx=""):
    """First evaluation where test_id / test_ood (of the k-hop splits named with `sfx`) reach 0.8 and
    0.9, as 'epoch (minutes; CPU minutes)', and the route: the Stage-1 peak on the training questions
    and the first evaluation after it below 0.05 (the collapse)."""
    out = {"best_ood": max((m.get(f"acc/test_ood{sfx}", 0) for m in ms), default=0)}
    s1 = f"acc1/train_id{sfx}"
    st = [m for m in ms if s1 in m]
    peak = max(st, key=lambda m: m[s1], default=None)
    fall = next((m for m in st if peak and m["iter"] > peak["iter"] and m[s1] < 0.05), None)
    out["stage1_peak"] = f"{peak[s1]} ({epoch_of(peak)})" if peak else "-"
    out["stage1_collapse"] = epoch_of(fall) if fall else "-"
    for split in ("test_id", "test_ood"):
        for t in (0.8, 0.9):
            hit = next((m for m in ms if m.get(f"acc/{split}{sfx}", 0) >= t), None)
            cpu = f"; {hit['cpu_time'] / 60:.1f}" if hit and "cpu_time" in hit else ""
            out[f"{split}>={t}"] = (f"{epoch_of(hit)} ({hit['time'] / 60:.1f}{cpu})" if "time" in hit
                                             else f"{epoch_of(hit)}") if hit else "-"
    return out
