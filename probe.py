"""
Mechanistic probes of a trained checkpoint on the dataset it was trained on (paper Sec. 3.2, 5.1).

    python probe.py acc   --ckpt=out/symbolic_loop --n_loop=1,2,3      # Table 1(a): accuracy per split and loop
    python probe.py lens  --ckpt=out/symbolic_loop                     # Table 1(b): logit lens at the bridge
    python probe.py sweep --ckpt=out/symbolic_loop --norm=rms          # Fig. 2: the intervention of Eq. (2)
    python probe.py gate  --ckpt=out/nl_direct                         # learned gate per token type
    python probe.py exit  --ckpt=out/hops --exit_thresholds=0.5,0.9 --png=exit.png   # adaptive depth vs fixed K
    python probe.py exit  --ckpt=out/small_disco --exit_thresholds=0.5,0.9   # a pretraining run: val loss vs depth
    python probe.py plot  out/symbolic out/symbolic_loop out/symbolic_flat --png=assets/curves.png   # Fig. 3

Each prints a markdown table and writes JSON (--json=PATH, default OUT_DIR/probe_<command>.json).
The bridge of a two-hop question (a, r1, r2) is b with (a, r1, b) an atomic fact of the dataset;
the bridge position is 1 (the r1 token), where the model predicts b for the atom (a, r1).
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from checkpoint import config_mismatch, load_checkpoint
from inference import beside_checkpoint, exit_option, model_from_checkpoint, trained_on_tokens
import plots
from common import (ERRORS, FIGURE_METADATA, SYSTEM_CHECKS, CheckpointError, ConfigError, DataError, atomic_write, autocast,
                    die, marked, owned, setup, table)
from configurator import INT_GE0, INT_GE1, OUTPUT, configure, num, one_of
from precision import resolve_dtype
from runlog import STOP_METRIC_CHECK
from shards import TokenShards
from datafolder import kind_of, read_meta
from tasks import QAData, accuracy

BRIDGE_POS = 1
NORMS = ("rms", "unit", "none")


def load(ckpt_path, data_dir=None, raw=False, tokens_ok=False):
    """(model, data): tasks.QAData, or where `tokens_ok` (exit) the val shards (shards.TokenShards) of a pretraining
    run. data_dir (default: the checkpoint's own) must hold the kind of data and the tokens the model was trained on."""
    ckpt = load_checkpoint(ckpt_path)
    made = ckpt.get("data_config", {})
    tokens = trained_on_tokens(ckpt)
    if tokens and not tokens_ok:
        raise CheckpointError(f"'{ckpt_path}' was trained on token shards: probe.py probes question-answer checkpoints "
                              "(symbolic, nl), and exit also a pretraining run; evaluate it with eval_harness.py")
    data_dir = data_dir or ckpt["config"]["data_dir"]
    kind = kind_of(read_meta(data_dir))  # the folder says what it is
    if kind != ("tokens" if tokens else "qa"):
        raise DataError(f"data_dir='{data_dir}' is not a {'token shard' if tokens else 'question-answer'} dataset "
                        f"({kind!r} data): the checkpoint was trained on one")
    if tokens:  # the same token ids: encoding, tokenizer file, tokenizer hash
        data = TokenShards(data_dir, "val")
        why = config_mismatch(made, data.meta.get("config", {}), ["encoding", "tiktoken_file", "tokenizer_file",
                                                                  "tokenizer_sha256"])
    else:
        data = QAData(data_dir)
        why = config_mismatch(made, data.meta["config"], list(data.meta["config"]))
    if why or data.vocab_size > ckpt["model_args"]["vocab_size"]:
        raise CheckpointError(f"checkpoint was trained on another dataset than '{data_dir}' "
                              f"({why or 'vocabulary size differs'})")
    if raw and "ema" not in ckpt:
        print(f"note: '{ckpt_path}' has no weight average: --raw=True changes nothing", file=sys.stderr)
    return model_from_checkpoint(ckpt, use_ema=not raw).eval(), data


def two_hop_splits(data):
    return [s for s, info in data.meta["splits"].items() if info["hops"] == 2]


def examples(data, split):
    """The symbolic example (entity, relations..., answer) behind each question of a split."""
    if "names" in data.meta:  # natural language: data/nl/prepare.py stores it with each sentence
        path = os.path.join(data.data_dir, f"{split}.text.jsonl")
        with open(path) as f:
            rows = [json.loads(line) for line in f]
        if rows and "example" not in rows[0]:
            raise DataError(f"'{path}' predates the 'example' field: run data/nl/prepare.py again")
        return [tuple(r["example"]) for r in rows]
    X, Y = data.splits[split]
    hops = data.meta["splits"][split]["hops"]
    v = data.meta["vocab"]
    return [tuple(v[i] for i in x[o:o + hops + 1].tolist()) + (v[int(y[y != -1][0])],)
            for x, y, o in zip(X, Y, lead_pads(data, X).tolist())]


def lead_pads(data, X):
    """The '_' tokens each row starts with (data/symbolic/prepare.py's pad_left, training splits; else 0)."""
    if not data.meta["config"].get("pad_left"):
        return torch.zeros(len(X), dtype=torch.long)
    return (X == data.stoi["_"]).long().cumprod(1).sum(1)


def bridges(data, split, depth=1):
    """Token id of the entity each question of a k-hop split reaches after its first `depth` hops
    (a -r1-> b1 -r2-> b2 ...), from the atomic facts; depth k is the answer. For a name of several
    tokens, its first token."""
    atoms = {ex[:2]: ex[2] for ex in examples(data, "train_atom")}
    X, Y = data.splits["train_atom"]
    first = (Y != -1).int().argmax(1)  # an entity's token: the first answer token of an atom it answers
    token = {ex[2]: int(Y[i, first[i]]) for i, ex in enumerate(examples(data, "train_atom"))}
    out = []
    for ex in examples(data, split):
        e = ex[0]
        for r in ex[1:depth + 1]:
            e = atoms[(e, r)]
        out.append(token[e])
    return torch.tensor(out)


def atom_graphs(data):
    """The graph ('A' = ID, 'B' = OOD) of each atomic fact of train_atom, from its subject."""
    graph = {e: g for g, es in data.meta["entities"].items() for e in es}
    return [graph[ex[0]] for ex in examples(data, "train_atom")]


def cmd_acc(model, data, n_loops):
    """Accuracy of every split with the head read after each n in n_loops, and of the atoms of each
    graph apart: a two-hop question needs its bridge read out at loop 1, so OOD generalization needs
    the OOD graph's facts there too (atoms_B at n_loop=1), not only after the last loop."""
    splits = dict(data.splits)
    if "train_atom" in splits:
        X, Y = splits["train_atom"]
        g = torch.tensor([x == "A" for x in atom_graphs(data)])
        splits.update(atoms_A=(X[g], Y[g]), atoms_B=(X[~g], Y[~g]))
    res = {n: {s: accuracy(model, X, Y, n_loop=n)[0] for s, (X, Y) in splits.items()} for n in n_loops}
    print(table(["n_loop"] + list(splits), [[n] + [res[n][s] for s in splits] for n in n_loops]))
    return {str(n): r for n, r in res.items()}


@torch.no_grad()
def cmd_lens(model, data):
    """Logit lens at the bridge position after loop 1: mean P(b | H1), cos(H1, W[b]), how often b is
    the argmax and the final accuracy on those questions (is the hand-off to loop 2 used?); for
    DiscoLoop also cos of the injected state H~1 with W[b]. On deeper splits (k hops)
    the same for every bridge j < k after loop j, so one can see where a chain of hand-offs breaks
    (rows 'split bj'). Symbolic bridge j sits at position j; a sentence's bridge position is measured:
    the one where loop 1 decodes the bridge most often on train_id (the 'where' table, every position)."""
    W = model.transformer.wte.weight
    out, where = {}, {}
    symbolic = "names" not in data.meta
    splits = sorted((s for s, info in data.meta["splits"].items() if info["hops"] >= 2), key=lambda s: s != "train_id")
    splits = lens_splits(model, data, splits)
    for s in splits:
        hops = data.meta["splits"][s]["hops"]
        X, Y = data.splits[s]
        seen = {}
        logits, _ = model(X, n_loop=hops, hook=lambda k, h, nxt: seen.update({k: (h, nxt)}))
        right = ((logits.argmax(-1) == Y) | (Y == -1)).all(1)
        off, rows = lead_pads(data, X), torch.arange(len(X))  # positions count from each row's first real token
        n_q = int((Y[0] != -1).int().argmax()) + 1 - int(off[0])  # question positions (layouts are fixed per split)
        cols = off[:, None] + torch.arange(n_q)
        for j in range(1, hops):
            b = bridges(data, s, j)
            hit = model.head(seen[j][0][rows[:, None], cols]).argmax(-1) == b[:, None]
            where[f"{s} b{j}"] = hit.float().mean(0).tolist()
            if not symbolic and not (j == 1 and "train_id b1" in where):
                continue
            t = j if symbolic else max(range(len(where["train_id b1"])), key=where["train_id b1"].__getitem__)
            h, h_next = seen[j][0][rows, off + t], seen[j][1][rows, off + t]
            p = model.head(h).float().softmax(-1)
            ok = p.argmax(-1) == b
            r = {"pos": t, "P(b|H1)": p[torch.arange(len(b)), b].mean().item(), "argmax=b": ok.float().mean().item(),
                 "acc if argmax=b": right[ok].float().mean().item() if ok.any() else float("nan"),
                 "cos(H1,W[b])": F.cosine_similarity(h.float(), W[b].float(), dim=-1).mean().item()}
            if model.rec.injects:  # the state after DiscoLoop's injection, which feeds loop 2
                r["cos(H~1,W[b])"] = F.cosine_similarity(h_next.float(), W[b].float(), dim=-1).mean().item()
            out[s if hops == 2 else f"{s} b{j}"] = r
    cols = list(next(iter(out.values())))
    print(table(["split"] + cols, [[s] + [r[c] for c in cols] for s, r in out.items()]))
    n = max(len(v) for v in where.values())
    print(table(["argmax=b after loop j, by position"] + [f"pos{t}" for t in range(n)],
                [[s] + v + [""] * (n - len(v)) for s, v in where.items()]))
    return {**out, "where": where}


def lens_splits(model, data, splits):
    """The splits the lens can read: a k-hop question is run for k loops, which the K untied copies of a
    non-looped checkpoint (recurrence='none') cannot do for k > K; those splits are left out, and said so."""
    K = model.config.n_loop
    deep = [s for s in splits if model.rec.copies and data.meta["splits"][s]["hops"] > K]
    if deep and len(deep) == len(splits):
        raise CheckpointError(f"the lens runs a k-hop question for k loops: this non-looped checkpoint has {K} untied "
                              f"copies of f, fewer than the hops of every split ({', '.join(deep)})")
    if deep:
        print(f"(left out: {', '.join(deep)}, deeper than the {K} untied copies of this non-looped checkpoint)")
    return [s for s in splits if s not in deep]


def intervention(model, alpha, norm):
    """Eq. (2) between loops 1 and 2 at the bridge position: H <- (1-a) H + a Norm(W[b_max]),
    b_max the argmax of the head at H1_1. Norm: 'rms' rescales W[b_max] to the RMS of the state
    it replaces, 'unit' to unit L2 norm, 'none' leaves it. Applied to the state that feeds loop 2
    (for DiscoLoop, after the injection)."""
    def hook(k, h, nxt):
        if k != 1:
            return None
        W = model.transformer.wte.weight
        e = W[model.head(h[:, BRIDGE_POS]).argmax(-1)]
        x = nxt[:, BRIDGE_POS]
        if norm == "rms":
            e = e * (x.pow(2).mean(-1, keepdim=True).sqrt() / e.pow(2).mean(-1, keepdim=True).sqrt())
        elif norm == "unit":
            e = F.normalize(e, dim=-1)
        nxt = nxt.clone()
        nxt[:, BRIDGE_POS] = (1 - alpha) * x + alpha * e
        return nxt
    return hook


def cmd_sweep(model, data, norm, alphas, png=None):
    if model.rec.copies and model.config.n_loop < 2:
        raise CheckpointError("the sweep intervenes between loops 1 and 2: this non-looped checkpoint has only one "
                              "copy of f (n_loop=1)")
    splits = [s for s in two_hop_splits(data) if not data.meta["splits"][s]["train"]]
    res = {}
    for a in alphas:
        hook = intervention(model, a, norm)
        res[a] = {s: accuracy(model, *data.splits[s], n_loop=2, hook=hook)[0] for s in splits}
    print(table(["alpha"] + splits, [[f"{a:.1f}"] + [res[a][s] for s in splits] for a in alphas]))
    if png:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(4.5, 3.2))
        for s in splits:
            ax.plot(alphas, [res[a][s] for a in alphas], marker="o", label=s, ls="--" if "ood" in s else "-")
        ax.set(xlabel="intervention strength alpha", ylabel="two-hop accuracy", ylim=(0, 1.02),
               title=f"Eq. (2) at position 1, Norm={norm}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(png, dpi=120, metadata=FIGURE_METADATA)
        print(f"wrote {png}")
    return {"norm": norm, "results": {f"{a:.2f}": r for a, r in res.items()}}


@torch.no_grad()
def cmd_gate(model, data):
    """Mean learned gate alpha after each non-final loop over the question tokens of the two-hop
    splits, by token type (entity/relation/filler) and by position (which layouts are fixed here)."""
    if not model.rec.injects or model.config.disco_gate != "learned":
        raise CheckpointError("the gate probe needs a DiscoLoop checkpoint with disco_gate='learned'")
    kinds = data.meta.get("token_kinds") or {t: "entity" if t.startswith("e") else "filler" if t == "_" else "relation"
                                             for t in data.meta["vocab"]}  # '_': pad_left's pad
    names = ["entity", "relation", "filler", "other"]
    kind_of = torch.tensor([names.index(kinds.get(t, "other")) for t in data.meta["vocab"]])
    by_kind, by_pos, kind_at = {}, {}, {}  # (loop, key) -> [sum, count]; position -> kind counts
    for s in two_hop_splits(data):
        X, Y = data.splits[s]
        gates = {}
        model(X, hook=lambda k, h, nxt: gates.update({k: model.gate_values(h).float()}) if k < model.config.n_loop else None)
        n_tokens = (Y != -1).int().cumsum(1).eq(0).sum(1) + 1  # question length: positions up to the first answer
        mask = torch.arange(X.size(1))[None] < n_tokens[:, None]
        kind = kind_of[X]
        for t in range(X.size(1)):
            kind_at.setdefault(t, torch.zeros(len(names), dtype=torch.long))
            kind_at[t] += torch.bincount(kind[mask[:, t], t], minlength=len(names))
        for k, g in gates.items():
            for key, m in [(names[j], mask & (kind == j)) for j in range(len(names))] + \
                          [(f"pos{t}", mask & (torch.arange(X.size(1)) == t)) for t in range(X.size(1))]:
                acc = (by_pos if key.startswith("pos") else by_kind).setdefault((k, key), [0.0, 0])
                acc[0] += float(g[m].sum())
                acc[1] += int(m.sum())
    out = {f"loop{k}/{key}": v / n for (k, key), (v, n) in sorted(by_kind.items()) if n}
    print(table(["loop/token type", "mean gate"], [[k, v] for k, v in out.items()]))
    pos = {f"loop{k}/{key}": v / n for (k, key), (v, n) in by_pos.items() if n}
    rows = [[key, names[int(kind_at[int(key.split("pos")[1])].argmax())], v] for key, v in pos.items()]
    print(table(["loop/position", "main token type", "mean gate"], rows))
    return {**out, **pos}


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


def cmd_exit(model, data, exits, K, png=None, only=""):
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
    for ex in exits:
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
            rows.append([f"{ex.rule} {ex.threshold:g}", s, r["hops"], r["acc"], fixed[K][s], r["mean_loops"],
                         f"{1 - r['mean_loops'] / K:.1%}", " ".join(f"{v:.3f}" for v in hist.tolist()),
                         " ".join(f"{v:.2f}" for v in r["position_mean_exit"])])
        out["adaptive"][f"{ex.threshold:g}"] = res
    print(table(["exit", "split", "hops", "acc", f"acc K={K}", "loops/token", "blocks saved",
                 "answer exits at 1..K", "mean exit loop by position"], rows))
    print(table(["split", "hops"] + [f"fixed n={n}" for n in fixed],
                [[s, hops[s]] + [fixed[n][s] for n in fixed] for s in splits]))
    if png:
        plot_exit(out, hops, png, f"{exits[0].rule}, min_loops {exits[0].min_loops}")
    return out


@torch.no_grad()
def exit_loss(model, X, Y, n_loop, exits=None, batch_size=32):
    """(validation loss in nats per token, mean loops per token) over windows X -> Y (N, T), each token's next-token
    loss read off its own exit state (model.Exit) or, without exits, off loop n_loop."""
    total = 0.0
    for i in range(0, len(X), batch_size):
        h = model.hidden(X[i:i + batch_size], n_loop=n_loop, exits=exits)
        total += F.cross_entropy(model.head(h).float().flatten(0, 1), Y[i:i + batch_size].flatten(), reduction="sum").item()
    mean = torch.cat([t.flatten() for t in exits.loops]).double().mean().item() if exits is not None else n_loop
    if exits is not None:
        exits.loops.clear()
    return total / Y.numel(), mean


def cmd_exit_tokens(model, val, exits, K, windows, png=None):
    """Adaptive depth on a pretraining run: validation loss against mean loops per token, each threshold beside the
    fixed loop counts 1..K, over the val shards' first `windows` consecutive windows of block_size tokens."""
    T, n = model.config.block_size, windows or None
    starts = [(s, i) for s, size in enumerate(val.sizes) for i in range(0, int(size) - T, T)][:n]
    if not starts:  # every val shard shorter than one window
        raise DataError(f"the val shards of '{val.data_dir}' hold fewer than block_size={T} + 1 tokens: no window")
    X, Y = val.windows(*map(np.array, zip(*starts)), T)
    fixed = {n: {"val": exit_loss(model, X, Y, n)[0]} for n in range(1, K + 1)}
    out, rows = {"K": K, "windows": len(X), "tokens": Y.numel(), "fixed": fixed, "adaptive": {}}, []
    print(f"validation: {len(X)} windows of {T} tokens from the start of '{val.data_dir}' ({Y.numel():,} next-token losses)")
    for ex in exits:
        loss, mean = exit_loss(model, X, Y, K, ex)
        out["adaptive"][f"{ex.threshold:g}"] = {"val": {"loss": loss, "mean_loops": mean}}
        rows.append([f"{ex.rule} {ex.threshold:g} (min {ex.min_loops})", mean, f"{1 - mean / K:.1%}", loss])
    print(table(["exit", "loops/token", "blocks saved", "val loss"], rows + [[f"fixed n={n}", n, f"{1 - n / K:.1%}",
                                                                              fixed[n]["val"]] for n in fixed]))
    if png:
        plot_exit(out, {"val": "val"}, png, f"{exits[0].rule}, min_loops {exits[0].min_loops}", "loss")
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
    fig.savefig(png, dpi=120, metadata=FIGURE_METADATA)
    print(f"wrote {png}")


COMMANDS = {"acc": "Table 1(a): accuracy per split after 1..K+1 loops",
            "lens": "Table 1(b): logit lens at the bridge position",
            "sweep": "Fig. 2: the training-free intervention of Eq. (2), swept over alpha",
            "gate": "the learned gate by token type and position",
            "exit": "adaptive depth (model.Exit) vs fixed K: per split accuracy, exit loops, loops per token (a "
                    "pretraining run: validation loss)",
            "plot": "Fig. 3: training curves of run folders (given as positional arguments)"}
DEFAULTS = dict(
    ckpt="",          # checkpoint file or run folder (every command but plot)
    data_dir="",      # dataset folder (default: the one the checkpoint was trained on)
    n_loop="",        # acc: comma-separated loop counts (default: 1..K+1); exit: the most loops (default K)
    norm="rms",       # sweep: Norm of Eq. (2): 'rms' (match the hidden state's RMS), 'unit' or 'none'
    alphas="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0",  # sweep: comma-separated intervention strengths
    png="",           # sweep, plot: write a figure here
    json="",          # output JSON (default: OUT_DIR/probe_<command>.json)
    stop_metric="",   # plot: replay train.py's early stopping on each log with this metric (e.g. 'loss/val_id')
    stop_patience=10,  # plot: ... and this patience (evaluations)
    at_epoch=-1.0,    # plot: read every run only up to this epoch (-1 = to its end), e.g. to compare routes
    hops=2,           # plot: which questions to draw and tabulate (3 = the *_3hop splits of config/symbolic3.py)
    exit_rule="prob",  # exit: 'prob' (top probability >= threshold) or 'kl' (KL between loops <= threshold)
    exit_thresholds="0.5,0.7,0.8,0.9,0.95,0.99",  # exit: comma-separated thresholds, one adaptive point each
    exit_min_loops=1,  # exit: no token exits before this many loops
    splits="",        # exit: comma list of the splits to measure ('' = all)
    windows=0,        # exit on a pretraining run: the first this many val windows of block_size tokens (0 = all)
    raw=False,        # probe the raw weights, not the weight average (EMA)
    threads=0,        # CPU threads (0 = torch's choice)
    device="auto",    # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="float32",  # probes measure: fp32 unless asked; 'auto' = precision.py's rule, 'bfloat16'
)
CHECKPOINT_KEYS = {"ckpt", "data_dir", "json", "raw", "threads", "device", "dtype"}
USES = {"acc": CHECKPOINT_KEYS | {"n_loop"}, "lens": CHECKPOINT_KEYS, "gate": CHECKPOINT_KEYS,
        "sweep": CHECKPOINT_KEYS | {"norm", "alphas", "png"},
        "exit": CHECKPOINT_KEYS | {"n_loop", "png", "exit_rule", "exit_thresholds", "exit_min_loops", "splits",
                                           "windows"},
        "plot": {"png", "json", "stop_metric", "stop_patience", "at_epoch", "hops", "threads"}}


def loop_counts(text):
    """acc's --n_loop: comma-separated integers >= 1, or '' (1..K+1)."""
    return text == "" or all(p.strip().isdigit() and int(p) >= 1 for p in text.split(","))


def finite_numbers(text):
    """sweep's --alphas: comma-separated finite numbers."""
    try:
        return all(math.isfinite(float(x)) for x in text.split(","))
    except ValueError:
        return False


CHECKS = {**SYSTEM_CHECKS, "stop_metric": STOP_METRIC_CHECK, "stop_patience": INT_GE1, "json": OUTPUT,
          "png": (lambda v: plots.figure_path(v) and OUTPUT[0](v),
                  f"a writable figure path ending in {', '.join(plots.FIGURE_EXTENSIONS)}"),
          "norm": one_of(*NORMS), "n_loop": (loop_counts, "loop counts >= 1, comma-separated (e.g. '1,2,3')"),
          "alphas": (finite_numbers, "comma-separated finite numbers (e.g. '0,0.5,1')"),
          "exit_thresholds": (finite_numbers, "comma-separated finite numbers (e.g. '0.5,0.9')"),
          "exit_rule": one_of("prob", "kl"), "exit_min_loops": INT_GE1, "windows": INT_GE0,
          "at_epoch": (lambda v: v == -1 or num(0)[0](v), "-1 (the whole run) or an epoch >= 0"),
          "hops": (lambda v: v >= 2, "an integer >= 2 (the k of the k-hop splits)")}


def parse_args(argv):
    """(command, run folders for plot, config), every key checked before any work; a bad one is one line, exit 2."""
    usage = "usage: probe.py {" + ",".join(COMMANDS) + "} [--key=value ...]   (plot: run folders as arguments)"
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + usage + "\n" + "\n".join(f"  {k:<6} {v}" for k, v in COMMANDS.items()))
        sys.exit(0)
    if not argv or argv[0] not in COMMANDS:
        die((f"command {argv[0]!r} is invalid" if argv else "a command is required") + f": allowed {list(COMMANDS)} "
            f"({usage})")
    cmd, rest = argv[0], argv[1:]
    dirs = [x for x in rest if not x.startswith("-")] if cmd == "plot" else []
    # before configure: its checks would judge a refused key's value, and may make a --png/--json folder
    foreign = {x[2:].split("=")[0] for x in rest if x.startswith("--")} & set(DEFAULTS) - USES[cmd]
    if foreign:  # silently ignored, a key would look applied (e.g. --norm on acc)
        die(f"{', '.join('--' + k for k in sorted(foreign))} does not apply to probe.py {cmd}: allowed "
            f"{', '.join('--' + k for k in sorted(USES[cmd]))}")
    try:
        a = configure(DEFAULTS, [x for x in rest if x not in dirs], f"probe.py {cmd}: {COMMANDS[cmd]}", __file__, CHECKS)
    except ConfigError as e:
        die(e)
    if cmd == "plot" and not dirs:
        die("plot needs one or more run folders")
    if cmd == "plot":
        a["png"] = a["png"] or "curves.png"  # plot always draws: its default figure is checked like a given one
    try:
        owned(a["png"], "figure", "png")  # a figure there is replaced only if this project drew it
    except ConfigError as e:
        die(e)
    if cmd != "plot" and not a["ckpt"]:
        die(f"{cmd} needs --ckpt=PATH")
    return cmd, dirs, a


def acc_loops(text, model):
    """acc's loop counts: --n_loop, or 1..K+1 (1..K for the untied copies of recurrence='none', which have no loop
    past K: asked for explicitly, such a count is refused, not dropped)."""
    K = model.config.n_loop
    if not text:
        return list(range(1, K + (1 if model.rec.copies else 2)))
    loops = [int(n) for n in text.split(",")]
    if model.rec.copies and max(loops) > K:
        raise ConfigError(f"n_loop={text!r} is invalid: allowed loop counts 1..{K} for this non-looped checkpoint "
                          f"(recurrence='none': {K} untied copies of f, no loop past them)")
    return loops


def run_probe(cmd, a, device):
    """A checkpoint command: (results, JSON path)."""
    out = a["json"] or beside_checkpoint(a["ckpt"], f"probe_{cmd}.json")  # before the work, not after it
    owned(out, "json")
    model, data = load(a["ckpt"], a["data_dir"], a["raw"], tokens_ok=cmd == "exit")
    if a["windows"] and not isinstance(data, TokenShards):
        raise ConfigError(f"windows={a['windows']} applies to a pretraining run's validation shards; this checkpoint "
                          "is question-answer: --splits chooses what is measured")
    if cmd == "exit":  # every threshold checked (and exits on a non-looped checkpoint refused) before the work
        if "," in a["n_loop"]:
            raise ConfigError(f"n_loop={a['n_loop']!r} is invalid for probe.py exit: allowed one loop count (the most)")
        K = int(a["n_loop"] or model.config.n_loop)
        ts = a["exit_thresholds"].split(",")
        if len({f"{float(t):g}" for t in ts}) < len(ts):  # results are keyed by the printed threshold
            raise ConfigError(f"exit_thresholds={a['exit_thresholds']!r} repeats a threshold: give each once")
        exits = [exit_option(a["exit_rule"], t, a["exit_min_loops"], model, K) for t in ts]
    with torch.no_grad(), autocast(device, resolve_dtype(a["dtype"], device)):
        if cmd == "acc":
            res = cmd_acc(model, data, acc_loops(a["n_loop"], model))
        elif cmd == "lens":
            res = cmd_lens(model, data)
        elif cmd == "exit" and isinstance(data, TokenShards):
            if a["splits"]:
                raise ConfigError(f"splits={a['splits']!r} names question splits: a pretraining run has one, val")
            res = cmd_exit_tokens(model, data, exits, K, a["windows"], a["png"] or None)
        elif cmd == "exit":
            res = cmd_exit(model, data, exits, K, a["png"] or None, a["splits"])
        elif cmd == "sweep":
            res = cmd_sweep(model, data, a["norm"], [float(x) for x in a["alphas"].split(",")], a["png"] or None)
        else:
            res = cmd_gate(model, data)
    return res, out


def main(argv):
    cmd, dirs, a = parse_args(argv)
    try:
        device = setup(a["device"], a["threads"])
    except ValueError as e:
        die(e)
    if device != "cpu":
        torch.set_default_device(device)  # data, model and every probe tensor are made there
    try:
        if cmd == "plot":
            owned(a["json"], "json")
            res = plots.plot(dirs, a["png"], a["stop_metric"], a["stop_patience"], a["at_epoch"],
                             a["hops"])
            json_path = a["json"] or None
        else:
            res, json_path = run_probe(cmd, a, device)
    except ERRORS as e:
        die(e)
    if json_path:
        try:
            atomic_write(json_path, json.dumps(marked({"probe": cmd, **res}, f"probe.py {cmd}"), indent=1))
        except OSError as e:  # e.g. the default path, in a read-only run folder
            die(f"could not write '{json_path}' ({e.strerror}): pass --json=PATH somewhere writable")
        print(f"wrote {json_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
