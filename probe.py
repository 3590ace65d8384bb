"""
Mechanistic probes of a trained checkpoint on the dataset it was trained on (paper Sec. 3.2, 5.1).

    python probe.py acc   --ckpt=out/symbolic_loop --n_loop=1,2,3      # Table 1(a): accuracy per split and loop
    python probe.py lens  --ckpt=out/symbolic_loop                     # Table 1(b): logit lens at the bridge
    python probe.py sweep --ckpt=out/symbolic_loop --norm=rms          # Fig. 2: the intervention of Eq. (2)
    python probe.py gate  --ckpt=out/nl_direct                         # learned gate per token type
    python probe.py plot  out/symbolic out/symbolic_loop out/symbolic_flat --png=assets/curves.png   # Fig. 3

Each prints a markdown table and writes JSON (--json=PATH, default OUT_DIR/probe_<command>.json). Adaptive depth
(`probe.py exit` until issue 63) is exits.py's: an inference feature, measured on question-answer and token data.
The bridge of a two-hop question (a, r1, r2) is b with (a, r1, b) an atomic fact of the dataset;
the bridge position is 1 (the r1 token), where the model predicts b for the atom (a, r1).
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

from discoloop.from_checkpoint import beside_checkpoint, lead_pads, load
from discoloop import plots
from discoloop.common import (ERRORS, SYSTEM_CHECKS, CheckpointError, ConfigError, DataError, atomic_write, autocast,
                              die, setup, table)
from discoloop.ownership import marked, target
from configurator import INT_GE1, OUTPUT, configure, num, one_of
from discoloop.precision import resolve_dtype
from discoloop.curriculum import STOP_METRIC_CHECK
from discoloop.qa_data import accuracy

BRIDGE_POS = 1
NORMS = ("rms", "unit", "none")


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
        plots.save_figure(fig, png, 120)
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


def run_plot(dirs, a):
    a["json"] = target(a["json"], "probe.py", "json")
    return plots.plot(dirs, a["png"], a["stop_metric"], a["stop_patience"], a["at_epoch"], a["hops"])


CHECKPOINT_KEYS = {"ckpt", "data_dir", "json", "raw", "threads", "device", "dtype"}
# verb -> (what it runs: on (model, data, keys), plot on (run folders, keys); the keys it uses; its help line)
VERBS = {
    "acc": (lambda model, data, a: cmd_acc(model, data, acc_loops(a["n_loop"], model)), CHECKPOINT_KEYS | {"n_loop"},
            "Table 1(a): accuracy per split after 1..K+1 loops"),
    "lens": (lambda model, data, a: cmd_lens(model, data), CHECKPOINT_KEYS,
             "Table 1(b): logit lens at the bridge position"),
    "sweep": (lambda model, data, a: cmd_sweep(model, data, a["norm"], [float(x) for x in a["alphas"].split(",")],
                                               a["png"] or None), CHECKPOINT_KEYS | {"norm", "alphas", "png"},
              "Fig. 2: the training-free intervention of Eq. (2), swept over alpha"),
    "gate": (lambda model, data, a: cmd_gate(model, data), CHECKPOINT_KEYS,
             "the learned gate by token type and position"),
    "plot": (run_plot, {"png", "json", "stop_metric", "stop_patience", "at_epoch", "hops", "threads"},
             "Fig. 3: training curves of run folders (given as positional arguments)"),
}
MOVED = {"exit": "exits.py: python exits.py --ckpt=RUN [--exit_thresholds=...] (its keys as they were)"}
DEFAULTS = dict(
    ckpt="",          # checkpoint file or run folder (every command but plot)
    data_dir="",      # dataset folder (default: the one the checkpoint was trained on)
    n_loop="",        # acc: comma-separated loop counts (default: 1..K+1)
    norm="rms",       # sweep: Norm of Eq. (2): 'rms' (match the hidden state's RMS), 'unit' or 'none'
    alphas="0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,1.0",  # sweep: comma-separated intervention strengths
    png="",           # sweep, plot: write a figure here
    json="",          # output JSON (default: OUT_DIR/probe_<command>.json)
    stop_metric="",   # plot: replay train.py's early stopping on each log with this metric (e.g. 'loss/val_id')
    stop_patience=10,  # plot: ... and this patience (evaluations)
    at_epoch=-1.0,    # plot: read every run only up to this epoch (-1 = to its end), e.g. to compare routes
    hops=2,           # plot: which questions to draw and tabulate (3 = the *_3hop splits of config/symbolic3.py)
    raw=False,        # probe the raw weights, not the weight average (EMA)
    threads=0,        # CPU threads (0 = torch's choice)
    device="auto",    # 'auto' | 'cpu' | 'cuda' (common.py's rule)
    dtype="float32",  # probes measure: fp32 unless asked; 'auto' = precision.py's rule, 'bfloat16'
)


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
          "at_epoch": (lambda v: v == -1 or num(0)[0](v), "-1 (the whole run) or an epoch >= 0"),
          "hops": (lambda v: v >= 2, "an integer >= 2 (the k of the k-hop splits)")}


def parse_args(argv):
    """(command, run folders for plot, config), every key checked before any work; a bad one is one line, exit 2."""
    usage = "usage: probe.py {" + ",".join(VERBS) + "} [--key=value ...]   (plot: run folders as arguments)"
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + usage + "\n" + "\n".join(f"  {k:<6} {h}" for k, (_, _, h) in VERBS.items()))
        sys.exit(0)
    if argv and argv[0] in MOVED:
        die(f"probe.py {argv[0]} moved to {MOVED[argv[0]]}")
    if not argv or argv[0] not in VERBS:
        die((f"command {argv[0]!r} is invalid" if argv else "a command is required") + f": allowed {list(VERBS)} "
            f"({usage})")
    cmd, rest = argv[0], argv[1:]
    dirs = [x for x in rest if not x.startswith("-")] if cmd == "plot" else []
    # before configure: its checks would judge a refused key's value, and may make a --png/--json folder
    foreign = {x[2:].split("=")[0] for x in rest if x.startswith("--")} & set(DEFAULTS) - VERBS[cmd][1]
    if foreign:  # silently ignored, a key would look applied (e.g. --norm on acc)
        die(f"{', '.join('--' + k for k in sorted(foreign))} does not apply to probe.py {cmd}: allowed "
            f"{', '.join('--' + k for k in sorted(VERBS[cmd][1]))}")
    try:
        a = configure(DEFAULTS, [x for x in rest if x not in dirs], f"probe.py {cmd}: {VERBS[cmd][2]}", __file__, CHECKS)
    except ConfigError as e:
        die(e)
    if cmd == "plot" and not dirs:
        die("plot needs one or more run folders")
    if cmd == "plot":
        a["png"] = a["png"] or "curves.png"  # plot always draws: its default figure is checked like a given one
    try:
        a["png"] = target(a["png"], "figure", "png")  # a figure there is replaced only if this project drew it
    except ConfigError as e:
        die(e)
    if "ckpt" in VERBS[cmd][1] and not a["ckpt"]:
        die(f"{cmd} needs --ckpt=PATH")
    return cmd, dirs, a


def run_probe(cmd, a, device):
    """A checkpoint command: (results, JSON path)."""
    out = a["json"] or beside_checkpoint(a["ckpt"], f"probe_{cmd}.json")  # before the work, not after it
    out = target(out, "probe.py", "json")
    model, data = load(a["ckpt"], a["data_dir"], a["raw"])
    with torch.no_grad(), autocast(device, resolve_dtype(a["dtype"], device)):
        return VERBS[cmd][0](model, data, a), out


def main(argv):
    cmd, dirs, a = parse_args(argv)
    try:
        device = setup(a["device"], a["threads"])
    except ValueError as e:
        die(e)
    if device != "cpu":
        torch.set_default_device(device)  # data, model and every probe tensor are made there
    try:  # a verb reads a checkpoint (and its dataset) or, plot, run folders
        res, json_path = run_probe(cmd, a, device) if "ckpt" in VERBS[cmd][1] else (VERBS[cmd][0](dirs, a), a["json"])
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
