"""
Adaptive depth (model.Exit) measured against fixed loop counts 1..K on the data a checkpoint was trained on, and the
learned exit trained for it (issue 62):

    python exits.py --ckpt=out/hops --exit_thresholds=0.5,0.9 --png=exit.png        # accuracy vs loops per token
    python exits.py --ckpt=out/small_disco --windows=256 --exit_thresholds=0.5,0.9  # a pretraining run: val loss
    python exits.py gate --ckpt=out/small_disco                      # the learned exit: out/small_disco/ckpt.exit_gate.pt
    python exits.py --ckpt=out/small_disco --windows=256 --exit_rule=gate           # ... measured (its threshold too)

A question-answer checkpoint (symbolic, nl) is measured per split: accuracy, loops per token, the loop each answer exits
at; a pretraining run on the first --windows windows of its val shards: loss, loops per token, and how often a token's
top-1 is not loop K's. Tables are printed and JSON written (--json=PATH, default OUT_DIR/exits.json).

`gate` trains from_checkpoint.ExitGate (one for every loop; --gate_features: 'change', 6 parameters reading how the loop
changed what it decodes and its state; 'state', n_embd + 4, issue 62's) on the frozen model, on its own training data,
with labels the model makes itself: 'agree' (loop k's top-1 is loop K's: CALM's consistency) or 'improve' (the
next loop does not lower this token's loss: Ouro's second stage, its soft label). Its threshold is then calibrated on
held-out data (the val splits; a pretraining run's last --calib_windows val windows, apart from the first ones measured)
as the lowest at which at most --gate_bound of the exited tokens have a top-1 other than loop K's (the real adaptive
forward; the share of all tokens changed, through attention to an exited token's copied state too, is shown beside it),
and kept in the file: exit_rule='gate''s default threshold wherever exits are offered.
"""
import dataclasses
import json
import math
import sys

import numpy as np
import torch
import torch.nn.functional as F

from discoloop import plots
from discoloop.common import (ERRORS, SYSTEM_CHECKS, CheckpointError, ConfigError, DataError, atomic_write, autocast,
                              check_writable, die, setup, table)
from discoloop.ownership import marked, owned, target
from configurator import INT_GE0, INT_GE1, OUTPUT, configure, num, one_of
from discoloop.from_checkpoint import (GATE_FEATURES, ExitGate, beside_checkpoint, exit_option, gate_path, lead_pads,
                                       load, weights_crc)
from model import EXIT_RULES, Exit
from discoloop.precision import resolve_dtype
from discoloop.shards import TokenShards
from discoloop.qa_data import accuracy

THRESHOLDS = "0.5,0.7,0.8,0.9,0.95,0.99"  # exit_thresholds='' ('gate': and its calibrated one)
IMPROVE_SHARPNESS, IMPROVE_MARGIN = 50.0, 0.005  # Ouro's stage-2 label: continue = sigmoid(50 (L_k - L_k+1 - 0.005))


@torch.no_grad()
def adaptive_accuracy(model, X, Y, exits, K, batch_size=2048):
    """(right (N,), exit loops (N, T)) of a question split with adaptive depth (model.Exit), the head read off each
    answer token's own exit state."""
    right, loops = [], []
    for i in range(0, len(X), batch_size):
        x, y = X[i:i + batch_size], Y[i:i + batch_size]
        h = model.hidden(x, n_loop=K, exits=exits)
        ok = torch.ones_like(y, dtype=torch.bool)
        ok[y != -1] = model.head(h[y != -1]).argmax(-1) == y[y != -1]
        right.append(ok.all(1))
        loops.append(exits.loops.pop())
    return torch.cat(right), torch.cat(loops)


def measure_qa(model, data, exits, K, png=None, only=""):
    """Adaptive depth (model.Exit, one per threshold) against fixed loop counts 1..K, per split: accuracy, the mean
    loops per token (a question's real tokens, pads left out: the blocks it runs are these x the looped layers),
    the exit loop of the answer token (histogram) and of each position (mean, from the first real token)."""
    names = only.split(",") if only else []
    if len(set(names)) < len(names) or "" in names:
        raise ConfigError(f"splits={only!r} repeats a split or has an empty one: give each split once")
    splits = {s: v for s, v in data.splits.items() if not names or s in names}
    if not splits:
        raise ConfigError(f"splits={only!r} names no split of this dataset: allowed a comma list of {list(data.splits)}")
    hops = {s: data.meta["splits"][s]["hops"] for s in splits}
    fixed = {n: {s: accuracy(model, X, Y, n_loop=n)[0] for s, (X, Y) in splits.items()} for n in range(1, K + 1)}
    out, rows = {"K": K, "fixed": fixed, "adaptive": {}}, []
    for key, ex in exits.items():
        res = {}
        for s, (X, Y) in splits.items():
            right, at = adaptive_accuracy(model, X, Y, ex, K)
            rel = torch.arange(X.size(1))[None] - lead_pads(data, X)[:, None]  # position from the first real token
            last = X.size(1) - 1 - (Y != -1).flip(1).int().argmax(1)  # the last answer token: right padding after it
            rel = rel.masked_fill(torch.arange(X.size(1))[None] > last[:, None], -1)  # (-1: not a real token)
            hist = torch.bincount(at[Y != -1], minlength=K + 1)[1:].float() / (Y != -1).sum()
            res[s] = {"hops": hops[s], "acc": right.double().mean().item(), "mean_loops": at[rel >= 0].double().mean().item(),
                      "answer_exit_hist": hist.tolist(),
                      "position_mean_exit": [at[rel == t].float().mean().item() for t in range(int(rel.max()) + 1)]}
            r = res[s]
            rows.append([f"{ex.rule} {key}", s, r["hops"], r["acc"], fixed[K][s], r["mean_loops"],
                         f"{1 - r['mean_loops'] / K:.1%}", " ".join(f"{v:.3f}" for v in hist.tolist()),
                         " ".join(f"{v:.2f}" for v in r["position_mean_exit"])])
        out["adaptive"][key] = res
    print(table(["exit", "split", "hops", "acc", f"acc K={K}", "loops/token", "blocks saved",
                 "answer exits at 1..K", "mean exit loop by position"], rows))
    print(table(["split", "hops"] + [f"fixed n={n}" for n in fixed],
                [[s, hops[s]] + [fixed[n][s] for n in fixed] for s in splits]))
    if png:
        ex = next(iter(exits.values()))
        plot_exit(out, hops, png, f"{ex.rule}, min_loops {ex.min_loops}")
    return out


@torch.no_grad()
def exit_run(model, X, Y, n_loop, exits=None, batch_size=32):
    """(mean next-token loss over the targets Y != -1, top-1 (N, T), exit loops (N, T) or None without exits) of rows
    X -> Y, each token's head read off its own exit state (model.Exit) or, without exits, off loop n_loop."""
    total, top = 0.0, []
    for i in range(0, len(X), batch_size):
        logits = model.head(model.hidden(X[i:i + batch_size], n_loop=n_loop, exits=exits)).float()
        total += F.cross_entropy(logits.flatten(0, 1), Y[i:i + batch_size].flatten(), ignore_index=-1,
                                 reduction="sum").item()
        top.append(logits.argmax(-1))
    loops = None if exits is None else torch.cat(exits.loops)
    if exits is not None:
        exits.loops.clear()
    return total / max(int((Y != -1).sum()), 1), torch.cat(top), loops


def changed(top, ref, loops, K, mask):
    """[exited tokens (before loop K) whose top-1 is not loop K's, tokens whose top-1 is not (exited or not: a later
    token attends to an exited one's copied state), exited tokens, tokens, loops run], counted over `mask`."""
    diff, out = top != ref, loops < K
    return [int((diff & out & mask).sum()), int((diff & mask).sum()), int((out & mask).sum()), int(mask.sum()),
            int(loops[mask].sum())]


def rates(c):
    """The shares of changed() counts (summed over parts): what the gate's bound holds (changed_top1, of the exited
    tokens), every change (changed_all, of all tokens), exited, mean loops per token."""
    return {"changed_top1": float(c[0] / max(c[2], 1)), "changed_all": float(c[1] / c[3]), "exited": float(c[2] / c[3]),
            "mean_loops": float(c[4] / c[3])}  # plain floats: the gate file is read with weights_only


def window_starts(shards, T, split):
    """[(shard, start token)] of every window of T tokens (and the next token) over the shards of one split; none (every
    shard shorter than one window) is one line."""
    starts = [(s, i) for s, size in enumerate(shards.sizes) for i in range(0, int(size) - T, T)]
    if not starts:
        raise DataError(f"the {split} shards of '{shards.data_dir}' hold fewer than block_size={T} + 1 tokens "
                        f"(the longest: {int(max(shards.sizes))}): no window; allowed shards longer than the checkpoint's "
                        "block_size (prepare more tokens)")
    return starts


def val_windows(val, T, n, last=False):
    """((X, Y) of the first (last) n windows of T tokens over the val shards (n = 0: all of them), how many there are)."""
    starts = window_starts(val, T, "val")
    chosen = (starts[-n:] if last else starts[:n]) if n else starts
    return val.windows(*map(np.array, zip(*chosen)), T), len(starts)


def measure_tokens(model, val, exits, K, windows, png=None):
    """Adaptive depth on a pretraining run: validation loss against mean loops per token, each threshold beside the
    fixed loop counts 1..K, over the val shards' first `windows` consecutive windows of block_size tokens; and how
    often a top-1 is not loop K's (rates: of the exited tokens, the gate's calibration bound; of all)."""
    T = model.config.block_size
    (X, Y), _ = val_windows(val, T, windows)
    fixed, ref = {}, None
    for n in range(1, K + 1):
        loss, top, _ = exit_run(model, X, Y, n)
        fixed[n], ref = {"val": loss}, top
    out, rows = {"K": K, "windows": len(X), "tokens": Y.numel(), "fixed": fixed, "adaptive": {}}, []
    print(f"validation: {len(X)} windows of {T} tokens from the start of '{val.data_dir}' ({Y.numel():,} next-token losses)")
    for key, ex in exits.items():
        loss, top, loops = exit_run(model, X, Y, K, ex)
        r = {"loss": loss, **rates(changed(top, ref, loops, K, Y != -1))}
        out["adaptive"][key] = {"val": r}
        rows.append([f"{ex.rule} {key} (min {ex.min_loops})", r["mean_loops"], f"{1 - r['mean_loops'] / K:.1%}", loss,
                     f"{r['exited']:.1%}", f"{r['changed_top1']:.2%}", f"{r['changed_all']:.2%}"])
    print(table(["exit", "loops/token", "blocks saved", "val loss", "exited", "top-1 not loop K's: of exited", "of all"],
                rows + [[f"fixed n={n}", n, f"{1 - n / K:.1%}", fixed[n]["val"], "", "", ""] for n in fixed]))
    if png:
        ex = next(iter(exits.values()))
        plot_exit(out, {"val": "val"}, png, f"{ex.rule}, min_loops {ex.min_loops}", "loss")
    return out


def plot_exit(out, hops, png, what, metric="acc"):
    """Accuracy (or validation loss) against mean loops per token: the adaptive curve over thresholds, the fixed-K
    points beside it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted(set(hops.values()))
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.2), squeeze=False)
    for ax, g in zip(axes[0], groups):
        for i, s in enumerate(s for s in hops if hops[s] == g):
            c = f"C{i}"
            pts = sorted((r[s]["mean_loops"], r[s][metric]) for r in out["adaptive"].values())
            ax.plot(*zip(*pts), marker="o", color=c, label=f"{s} adaptive")
            ax.plot(list(out["fixed"]), [out["fixed"][n][s] for n in out["fixed"]], marker="x", ls=":", color=c,
                    label=f"{s} fixed n")
        ax.set(xlabel="mean loops per token", ylabel="accuracy" if metric == "acc" else "validation loss (nats)",
               title=f"{g}-hop" if metric == "acc" else "validation shard")
        if metric == "acc":
            ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=6)
    fig.suptitle(f"adaptive depth ({what}) vs fixed loop counts", fontsize=9)
    fig.tight_layout()
    plots.save_figure(fig, png, 120)
    print(f"wrote {png}")


def exit_points(a, model):
    """{threshold key: model.Exit} of --exit_thresholds, every one checked (and exits on a non-looped checkpoint, or a
    missing or foreign gate, refused) before the work; 'gate' reads its file once, and '' adds its calibrated one."""
    K = a["n_loop"] or model.config.n_loop
    ts = [float(t) for t in (a["exit_thresholds"] or THRESHOLDS).split(",")]
    base = exit_option(a["exit_rule"], ts[0] if a["exit_thresholds"] else -1, a["exit_min_loops"], model, K, a["ckpt"])
    ts += [base.threshold] if a["exit_rule"] == "gate" and not a["exit_thresholds"] else []
    keys = [f"{t + 0.0:.12g}" for t in ts]  # + 0.0: -0.0 is 0
    if len(set(keys)) < len(keys):  # results are keyed by the threshold
        raise ConfigError(f"exit_thresholds={a['exit_thresholds']!r} repeats a threshold: give each once")
    try:
        return K, {k: Exit(base.rule, t, base.min_loops, score=base.score) for k, t in zip(keys, ts)}
    except ValueError as e:
        raise ConfigError(str(e)) from None


def run_measure(model, data, a):
    """The measurement verb: a question-answer checkpoint's splits, or a pretraining run's val windows."""
    K, exits = exit_points(a, model)
    if not isinstance(data, TokenShards):
        if a["windows"]:
            raise ConfigError(f"windows={a['windows']} applies to a pretraining run's validation shards; this checkpoint "
                              "is question-answer: --splits chooses what is measured")
        return measure_qa(model, data, exits, K, a["png"] or None, a["splits"])
    if a["splits"]:
        raise ConfigError(f"splits={a['splits']!r} names question splits: a pretraining run has one, val")
    return measure_tokens(model, data, exits, K, a["windows"], a["png"] or None)


def per_loop(model, X, Y, K, batch_size=32):
    """Each batch of the frozen model's full-depth forward over X -> Y: (Y's rows, [(state h_k, the p model.decode gives
    an exit there (None at K), the loop before's (p, h) or None, head logits) for loops k = 1..K])."""
    for i in range(0, len(X), batch_size):
        x, seen, before, loops = X[i:i + batch_size], {}, None, []
        model.hidden(x, n_loop=K, hook=lambda k, h, nxt: seen.update({k: h}))
        for k in range(1, K + 1):  # with a coda, loop k's output is the model run for k loops
            logits = (model.head(model.hidden(x, n_loop=k)) if model.config.n_coda else model.head(seen[k])).float()
            p = model.decode(seen[k], None, Exit())[0] if k < K else None
            loops.append((seen[k], p, before, logits))
            before = (p, seen[k])
        yield Y[i:i + batch_size], loops


@torch.no_grad()
def loop_records(model, X, Y, K, kind):
    """The gate's rows: for every target token (Y != -1) and loop k < K, the gate's inputs x (ExitGate.features of the
    `kind` gate), and the labels: 'agree' (loop k's top-1 is loop K's) and 'improve' (1 - sigmoid(50 (L_k - L_k+1 -
    0.005)): Ouro's continuation label turned round, without its clamp at 0: a loop that raises the loss is an exit)."""
    cols = {"x": [], "agree": [], "improve": [], "loop": []}
    for y, loops in per_loop(model, X, Y, K):
        m = y != -1
        top_K = loops[-1][3].argmax(-1)[m]
        losses = [F.cross_entropy(logits[m], y[m], reduction="none") for *_, logits in loops]
        for k, (h, p, before, logits) in enumerate(loops[:-1], 1):
            cols["x"].append(ExitGate.features(kind, model, h, p, before)[m])
            cols["loop"].append(torch.full_like(y[m], k))
            cols["agree"].append((logits.argmax(-1)[m] == top_K).float())
            cols["improve"].append(1 - torch.sigmoid(IMPROVE_SHARPNESS * (losses[k - 1] - losses[k] - IMPROVE_MARGIN)))
    return {c: torch.cat(v) for c, v in cols.items()}


def fit_gate(rows, label, iters, seed, kind, n_embd):
    """ExitGate fitted to rows[label] by full-batch Adam on the binary cross-entropy; (gate, its loss, the loss of the
    best constant, which the gate must beat to have learned anything)."""
    torch.manual_seed(seed)
    gate = ExitGate(n_embd, kind)
    opt = torch.optim.Adam(gate.parameters(), lr=1e-2)
    target = rows[label]
    with torch.enable_grad():
        for _ in range(iters):
            loss = F.binary_cross_entropy_with_logits(gate(rows["x"]), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    mean = target.mean().clamp(1e-6, 1 - 1e-6)
    const = F.binary_cross_entropy(mean.expand_as(target), target).item()
    return gate.eval(), F.binary_cross_entropy_with_logits(gate(rows["x"]), target).item(), const


@torch.no_grad()
def loop_scores(model, gate, parts, K):
    """Over the target tokens of parts [(X, Y)], from the full-depth forward: the gate's score after each loop k < K
    (N, K-1) and the top-1 after every loop (N, K)."""
    score, S, tops = gate.score(model), [], []
    for X, Y in parts:
        for y, loops in per_loop(model, X, Y, K):
            m = y != -1
            S.append(torch.stack([score(h, p, before)[m] for h, p, before, _ in loops[:-1]], -1))
            tops.append(torch.stack([logits.argmax(-1)[m] for *_, logits in loops], -1))
    return torch.cat(S).float(), torch.cat(tops)


def estimated_changes(S, tops, ts, min_loops):
    """For each threshold of ts, the share of the tokens that would exit whose top-1 is not loop K's, each token on its
    own full-depth path (what a later token reads of an exited one is left out: the real forward checks the choice)."""
    K, out = tops.size(1), []
    for t in ts.split(64):
        ok = S[None] >= t[:, None, None]  # (C, N, K-1)
        ok[..., :min_loops - 1] = False
        at = torch.where(ok.any(-1), ok.int().argmax(-1) + 1, K)  # (C, N) exit loop
        diff = tops.gather(1, (at - 1).T).T != tops[:, -1]
        out.append(diff.sum(1) / (at < K).sum(1).clamp_min(1))
    return torch.cat(out)


def calibrate(model, gate, parts, K, min_loops, bound, tries=6):
    """The lowest threshold at which at most `bound` of the exited target tokens of `parts` [(X, Y)] have a top-1 other
    than loop K's: candidates at 1,000 quantiles of the gate's scores, estimated on one full-depth forward, the lowest
    few that pass each run with the real adaptive forward until one meets the bound; where none does, 1.0 (exits only
    where the gate saturates) and met says whether even that does."""
    S, tops = loop_scores(model, gate, parts, K)
    ts = torch.quantile(S[:, min_loops - 1:].flatten(), torch.linspace(0, 1, 1001, dtype=S.dtype)).unique()
    est = estimated_changes(S, tops, ts, min_loops)
    refs = [exit_run(model, X, Y, K)[1] for X, Y in parts]
    score, tried = gate.score(model), []
    for t in [float(t) for t, e in zip(ts, est) if e <= bound][:tries] + [1.0]:
        ex = Exit("gate", t, min_loops, score=score)
        c = np.sum([changed(top, ref, loops, K, Y != -1) for (X, Y), ref in zip(parts, refs)
                    for _, top, loops in [exit_run(model, X, Y, K, ex)]], axis=0)
        tried.append(r := {"threshold": t, **rates(c)})
        if r["changed_top1"] <= bound or t == 1.0:
            return {**r, "met": r["changed_top1"] <= bound, "candidates": len(ts)}, tried


def gate_data(model, data, a):
    """(training rows X, Y from the run's own training data: about gate_tokens target tokens drawn at random; held-out
    parts [(X, Y)] that calibrate; what they are, in words)."""
    g = torch.Generator().manual_seed(a["seed"])
    if isinstance(data, TokenShards):
        T, train = model.config.block_size, TokenShards(data.data_dir, "train", data.meta)  # meta.json read once
        starts = window_starts(train, T, "train")
        window_starts(data, T, "val")  # both refused before the training rows are made
        pick = torch.randperm(len(starts), generator=g, device="cpu")[:math.ceil(a["gate_tokens"] / T)].tolist()
        X, Y = train.windows(*map(np.array, zip(*[starts[j] for j in sorted(pick)])), T)
        (VX, VY), n = val_windows(data, T, a["calib_windows"], last=True)
        return (X, Y), [(VX, VY)], (f"{len(X)} train windows; calibrated on the last {len(VX)} of the {n} val windows "
                                    f"of {T} tokens")
    val = [s for s in data.splits if s.startswith("val")]
    if not val:
        raise DataError(f"'{data.data_dir}' has no val split to calibrate the gate on (test splits never choose anything)")
    order = torch.randperm(len(data.train_X), generator=g, device="cpu")
    n = int(((data.train_Y[order] != -1).sum(1).cumsum(0) < a["gate_tokens"]).sum()) + 1
    rows = order[:n].sort().values
    return (data.train_X[rows], data.train_Y[rows]), [data.splits[s] for s in val], (
        f"{n} training questions; calibrated on {', '.join(val)}")


def run_gate(model, data, a):
    """The gate verb: train the learned exit on the run's own training data, calibrate it on held-out data, write it
    beside the checkpoint (marked, with the identity of the weights it was trained for)."""
    K, path = model.config.n_loop, gate_path(a["ckpt"])
    if model.rec.copies:
        raise ConfigError("exits.py gate trains an exit between loops: this checkpoint is recurrence='none' (K untied "
                          "copies of f, no loop to leave)")
    exit_option("prob", -1, a["exit_min_loops"], model, K)  # the other exit checks: at least 2 loops, min_loops < K
    (X, Y), parts, what = gate_data(model, data, a)
    rows = loop_records(model, X, Y, K, a["gate_features"])
    gate, bce, const = fit_gate(rows, a["gate_label"], a["gate_iters"], a["seed"], a["gate_features"],
                                model.config.n_embd)
    print(f"gate ({a['gate_features']}: {', '.join(GATE_FEATURES[a['gate_features']])}): {rows['x'].size(0):,} (token, "
          f"loop) rows from {what}; label {a['gate_label']!r}: BCE {bce:.4f} (the best constant: {const:.4f})")
    print(table(["loop k", "rows", "agree (top-1 = loop K's)", "improve label (mean)", "gate score (mean)"],
                [[k, int(m.sum()), rows["agree"][m].mean().item(), rows["improve"][m].mean().item(),
                  torch.sigmoid(gate(rows["x"][m])).mean().item()]
                 for k in range(1, K) for m in [rows["loop"] == k]]))
    cal, tried = calibrate(model, gate, parts, K, a["exit_min_loops"], a["gate_bound"])
    print(table(["threshold", "top-1 not loop K's: of exited", "of all", "exited", "loops/token"],
                [[f"{r['threshold']:.6g}", f"{r['changed_top1']:.2%}", f"{r['changed_all']:.2%}", f"{r['exited']:.1%}",
                  r["mean_loops"]] for r in sorted(tried, key=lambda r: r["threshold"])]))
    print(f"calibrated: threshold {cal['threshold']:.6g}: {cal['changed_top1']:.2%} of the exited tokens' top-1 is not "
          f"loop K's (bound {a['gate_bound']:g}{'' if cal['met'] else ', NOT met: no threshold meets it'}; of all tokens, "
          f"through attention too: {cal['changed_all']:.2%}), {cal['exited']:.1%} exited, {cal['mean_loops']:.3f} loops "
          f"per token of {K}")
    rec = {"gate": gate.state_dict(), "crc32": weights_crc(model), "model_args": dataclasses.asdict(model.config),
           "of": f"{a['ckpt']} ({'raw weights' if a['raw'] else 'its weight average, where it has one'})",
           "label": a["gate_label"], "gate_features": a["gate_features"], "features": GATE_FEATURES[a["gate_features"]],
           "K": K, "min_loops": a["exit_min_loops"], "bound": a["gate_bound"], "threshold": cal["threshold"],
           "calibration": {**cal, "data": what}, "training": {"rows": rows["x"].size(0), "bce": bce, "constant_bce": const,
                                                              "iters": a["gate_iters"], "seed": a["seed"]}}
    try:
        atomic_write(path, lambda f: torch.save(marked(rec, "exit gate"), f), durable=True)
    except OSError as e:
        raise CheckpointError(f"could not write '{path}' ({e.strerror}): the gate lives beside its checkpoint") from None
    print(f"wrote {path}")


CHECKPOINT_KEYS = {"ckpt", "data_dir", "raw", "threads", "device", "dtype"}
VERBS = {  # verb -> (what it runs on (model, data, keys), the keys it uses, its help line)
    "": (run_measure, CHECKPOINT_KEYS | {"json", "n_loop", "png", "exit_rule", "exit_thresholds", "exit_min_loops",
                                         "splits", "windows"},
         "adaptive depth vs fixed K: per split accuracy and exit loops (a pretraining run: validation loss)"),
    "gate": (run_gate, CHECKPOINT_KEYS | {"exit_min_loops", "gate_label", "gate_features", "gate_bound", "gate_tokens",
                                          "gate_iters", "calib_windows", "seed"},
             "train the learned exit on the run's training data, calibrate its threshold on held-out data"),
}
DEFAULTS = dict(
    ckpt="",          # checkpoint file or run folder
    data_dir="",      # dataset folder (default: the one the checkpoint was trained on)
    n_loop=0,         # the most loops K (0 = the trained K)
    png="",           # write a figure here
    json="",          # output JSON (default: OUT_DIR/exits.json)
    exit_rule="prob",  # 'prob' (top probability >= threshold), 'kl' (KL between loops <= threshold) or 'gate' (the
                       # learned exit trained beside the checkpoint by `python exits.py gate`)
    exit_thresholds="",  # comma-separated thresholds, one adaptive point each ('' = 0.5,...,0.99; 'gate': + its own)
    exit_min_loops=1,  # no token exits before this many loops (gate: calibrated with it)
    splits="",        # question-answer: comma list of the splits to measure ('' = all)
    windows=0,        # a pretraining run: the first this many val windows of block_size tokens (0 = all)
    gate_label="agree",  # gate: 'agree' (loop k's top-1 is loop K's: CALM) or 'improve' (the next loop does not lower
                         # the token's loss by 0.005: Ouro's stage 2)
    gate_features="change",  # gate: what it reads: 'change' (max p; top-1 flip, KL and |dh|/|h| from the loop
                             # before; loop 1) or 'state' (issue 62's: the normed state and three summaries of p)
    gate_bound=0.01,  # gate: at most this share of the exited held-out tokens may have a top-1 other than loop K's
    gate_tokens=32768,  # gate: target tokens of the run's own training data it is trained on (drawn at random)
    gate_iters=400,   # gate: full-batch Adam steps
    calib_windows=256,  # gate, a pretraining run: the LAST this many val windows calibrate (0 = all of them)
    seed=0,           # gate: which training tokens, and the gate's initialisation
    raw=False,        # the raw weights, not the weight average (EMA)
    threads=0,        # CPU threads (0 = torch's choice)
    device="auto",    # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="float32",  # fp32 unless asked; 'auto' = precision.py's rule, 'bfloat16'
)


def finite_numbers(text):
    """--exit_thresholds: comma-separated finite numbers, or ''."""
    try:
        return text == "" or all(math.isfinite(float(x)) for x in text.split(","))
    except ValueError:
        return False


CHECKS = {**SYSTEM_CHECKS, "json": OUTPUT, "n_loop": INT_GE0,
          "png": (lambda v: plots.figure_path(v) and OUTPUT[0](v),
                  f"a writable figure path ending in {', '.join(plots.FIGURE_EXTENSIONS)}"),
          "exit_thresholds": (finite_numbers, "comma-separated finite numbers (e.g. '0.5,0.9')"),
          "exit_rule": one_of(*EXIT_RULES), "exit_min_loops": INT_GE1, "windows": INT_GE0,
          "gate_label": one_of("agree", "improve"), "gate_features": one_of(*GATE_FEATURES), "gate_bound": num(0, 1),
          "gate_tokens": INT_GE1, "gate_iters": INT_GE1,
          "calib_windows": INT_GE0, "seed": INT_GE0}


def parse_args(argv):
    """(verb, config), every key checked before any work; a bad one is one line, exit 2."""
    usage = "usage: exits.py [gate] --ckpt=RUN [--key=value ...]"
    verb = argv[0] if argv and not argv[0].startswith("-") else ""
    rest = argv[1:] if verb else argv
    if verb not in VERBS:
        die(f"verb {verb!r} is invalid: allowed none (the measurement) or 'gate' ({usage})")
    stray = [x for x in rest if not x.startswith("--") and x != "-h"]
    if stray:
        die(f"{stray[0]!r} is invalid here: exits.py takes --key=value only ({usage})")
    foreign = {x[2:].split("=")[0] for x in rest} & set(DEFAULTS) - VERBS[verb][1]
    if foreign:  # silently ignored, a key would look applied (e.g. --gate_bound when measuring)
        die(f"{', '.join('--' + k for k in sorted(foreign))} does not apply to exits.py {verb or '(the measurement)'}: "
            f"allowed {', '.join('--' + k for k in sorted(VERBS[verb][1]))}")
    try:
        doc = "\n".join([__doc__.strip(), "", usage] + [f"  {v or '(none)':<6} {h}" for v, (_, _, h) in VERBS.items()])
        a = configure(DEFAULTS, rest, doc, __file__, CHECKS)  # -h / --help: this text and every key
        a["png"] = target(a["png"], "figure", "png")  # a figure there is replaced only if this project drew it
    except ConfigError as e:
        die(e)
    if not a["ckpt"]:
        die(f"exits.py{' ' + verb if verb else ''} needs --ckpt=PATH (a checkpoint file or run folder)")
    return verb, a


def write_json(path, res):
    try:
        atomic_write(path, json.dumps(marked(res, "exits.py"), indent=1))
    except OSError as e:  # e.g. the default path, in a read-only run folder
        raise ConfigError(f"could not write '{path}' ({e.strerror}): pass --json=PATH somewhere writable") from None
    print(f"wrote {path}")


def main(argv):
    verb, a = parse_args(argv)
    try:
        device = setup(a["device"], a["threads"])
    except ValueError as e:
        die(e)
    if device != "cpu":
        torch.set_default_device(device)  # data, model and every tensor are made there
    try:
        if verb == "gate":  # a file of this project's is replaced, a user's never (checked before the work)
            owned(gate_path(a["ckpt"]), "exit gate", "exit_gate")
            check_writable(gate_path(a["ckpt"]), "the gate is written beside its checkpoint: copy the run folder "
                                                 "somewhere writable")
        out = a["json"] or (beside_checkpoint(a["ckpt"], "exits.json") if verb == "" else "")  # before the work
        out = target(out, "exits.py", "json")
        if out:
            check_writable(out, "pass --json=PATH somewhere writable")
        model, data = load(a["ckpt"], a["data_dir"], a["raw"], tokens_ok=True)
        with torch.no_grad(), autocast(device, resolve_dtype(a["dtype"], device)):
            res = VERBS[verb][0](model, data, a)
        if out:
            write_json(out, {"exit_rule": a["exit_rule"], "exit_min_loops": a["exit_min_loops"], **res})
    except ERRORS as e:
        die(e)


if __name__ == "__main__":
    main(sys.argv[1:])
