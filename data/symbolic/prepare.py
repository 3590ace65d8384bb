"""
The symbolic two-graph k-hop dataset of the paper (Sec. 2, 3.1; Appendix A.2).

Two entity-disjoint graphs A and B share one relation vocabulary. Every entity has exactly
`out_degree` outgoing edges with distinct relations, targets in its own graph. Training: every
atomic fact of both graphs plus `n_train` compositional questions from A (split evenly over hops
2..max_hops); test_id: `n_test` further A questions per hop; test_ood: `n_test` B questions per hop
(no B composition is ever trained). `eval_hops` > max_hops adds evaluation-only deeper splits.
val_id: `n_val` further A questions per trained hop, disjoint from train and test, drawn from a
separate random stream (so adding them changes no other split): the split a run chooses its end
point and schedule from, leaving every test split unseen.

    python data/symbolic/prepare.py                       # paper's 2-hop data in data/symbolic/out
    python data/symbolic/prepare.py --max_hops=3 --n_test=1000 --out_dir=data/symbolic/hops3

Output: OUT/meta.json (vocab, entities, relations, splits, config) and one text file per split,
one example per line, whitespace-separated tokens, answer last. Split names: train_atom,
train_id, val_id, test_id, test_ood for 2 hops; k > 2 hops add the suffix _{k}hop (train_id_3hop, ...).
"""
import json
import os
import sys

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from discoloop.common import ConfigError  # noqa: E402
from configurator import FOLDER, INT_GE0  # noqa: E402
from discoloop.prepare_tools import cli, prepare_and_say, prepare_qa  # noqa: E402

ON_FIRST_USE = True  # train.py prepares this folder when it starts (a few seconds)
DEFAULTS = dict(
    out_dir=os.path.join(REPO, "data", "symbolic", "out"),  # folder to write (meta.json + one file per split)
    seed=0,            # seed of both graphs and of the question sampling
    n_entities=500,    # entities per graph (graph A: ID, graph B: OOD, entity-disjoint)
    n_relations=50,    # relations, shared by the two graphs
    out_degree=10,     # outgoing edges per entity, each with a distinct relation
    max_hops=2,        # longest training question (2 = two-hop; 3 adds 3-hop training questions)
    eval_hops=0,       # 0, or > max_hops: add evaluation-only splits up to this many hops
    n_train=10000,     # graph-A training questions (split evenly over 2..max_hops hops)
    n_test=2000,       # questions per test split
    n_val=2000,        # graph-A validation questions per trained hop count, disjoint from train and test
    pad_left=0,        # training questions (facts included) start after 0..pad_left '_' tokens, drawn once per question
                       # (test and val have none): varied offsets for hop extrapolation
)
# the relations between keys: check_config (a comment on the CHECKS line would be --help's meaning of its keys)
CHECKS = {"out_dir": FOLDER, "seed": INT_GE0}
GENERATOR_KEYS = [k for k in DEFAULTS if k != "out_dir"]  # what makes two datasets the same (added since: compat.py)


def check_config(c):
    for k in ("n_entities", "n_relations", "out_degree", "n_train", "n_test"):
        if c[k] < 1:
            raise ConfigError(f"{k}={c[k]} must be >= 1")
    for k in ("n_val", "pad_left"):
        if c[k] < 0:
            raise ConfigError(f"{k}={c[k]} must be >= 0")
    if c["out_degree"] > c["n_relations"]:
        raise ConfigError(f"out_degree={c['out_degree']} exceeds n_relations={c['n_relations']}: "
                          "each entity's edges need distinct relations")
    if c["max_hops"] < 2:
        raise ConfigError(f"max_hops={c['max_hops']} must be >= 2")
    if c["eval_hops"] and c["eval_hops"] <= c["max_hops"]:
        raise ConfigError(f"eval_hops={c['eval_hops']} must be 0 or > max_hops={c['max_hops']}")
    n_hops = c["max_hops"] - 1
    if c["n_train"] % n_hops:
        raise ConfigError(f"n_train={c['n_train']} must divide evenly over {n_hops} hop counts")
    for k in range(2, max(c["max_hops"], c["eval_hops"]) + 1):
        available = c["n_entities"] * c["out_degree"] ** k
        wanted = (c["n_train"] // n_hops + c["n_val"] if k <= c["max_hops"] else 0) + c["n_test"]
        if wanted > available:
            raise ConfigError(f"{wanted} {k}-hop questions asked for (n_train/n_val/n_test) but a graph has "
                              f"only {available} (n_entities * out_degree^{k})")


def make_graph(rng, entities, n_relations, out_degree):
    """{entity: {relation index: target entity}}: distinct relations per entity, targets in-graph."""
    graph = {}
    for e in entities:
        rels = rng.choice(n_relations, size=out_degree, replace=False)
        targets = rng.choice(len(entities), size=out_degree)
        graph[e] = {int(r): entities[t] for r, t in zip(sorted(rels), targets)}
    return graph


def follow(graph, a, rels):
    """The answer of the chain (a, r1, ..., rk), and its bridges."""
    path = [a]
    for r in rels:
        path.append(graph[path[-1]][r])
    return path[-1], path[1:-1]


def sample_chains(rng, graph, entities, hops, n, exclude=()):
    """n distinct chains (a, r1..rk) not in `exclude`, uniform over all chains (every entity has
    the same degree)."""
    seen, chains = set(exclude), []
    while len(chains) < n:
        a = entities[rng.integers(len(entities))]
        rels, e = [], a
        for _ in range(hops):
            r = int(rng.choice(list(graph[e])))
            rels.append(r)
            e = graph[e][r]
        key = (a, *rels)
        if key not in seen:
            seen.add(key)
            chains.append(key)
    return chains


def build(c):
    """All graphs and splits as {split: [(tokens..., answer)]} plus the metadata; no I/O."""
    check_config(c)
    rng = np.random.default_rng(c["seed"])
    n, m = c["n_entities"], c["n_relations"]
    ents = {"A": [f"e{i}" for i in range(n)], "B": [f"e{i}" for i in range(n, 2 * n)]}
    relations = [f"r{i}" for i in range(m)]
    graphs = {g: make_graph(rng, ents[g], m, c["out_degree"]) for g in ("A", "B")}
    splits = {"train_atom": [(a, relations[r], b) for g in ("A", "B")
                             for a, edges in graphs[g].items() for r, b in edges.items()]}
    info = {"train_atom": {"graph": "AB", "hops": 1, "train": True}}
    render = lambda g, ch: (ch[0], *[relations[r] for r in ch[1:]], follow(graphs[g], ch[0], ch[1:])[0])
    n_train_per_hop = c["n_train"] // (c["max_hops"] - 1)
    used_A = {}
    for k in range(2, max(c["max_hops"], c["eval_hops"]) + 1):
        sfx = "" if k == 2 else f"_{k}hop"
        n_tr = n_train_per_hop if k <= c["max_hops"] else 0
        chains = {"A": sample_chains(rng, graphs["A"], ents["A"], k, n_tr + c["n_test"]),
                  "B": sample_chains(rng, graphs["B"], ents["B"], k, c["n_test"])}
        used_A[k] = chains["A"]
        parts = [("train_id", "A", chains["A"][:n_tr], True), ("test_id", "A", chains["A"][n_tr:], False),
                 ("test_ood", "B", chains["B"], False)]
        for name, g, chs, train in parts:
            if chs:
                splits[name + sfx] = [render(g, ch) for ch in chs]
                info[name + sfx] = {"graph": g, "hops": k, "train": train}
    # validation last, from its own stream: every split above is the same with or without it
    vrng = np.random.default_rng([c["seed"], 1])
    for k in range(2, c["max_hops"] + 1) if c["n_val"] else ():
        sfx = "" if k == 2 else f"_{k}hop"
        chains = sample_chains(vrng, graphs["A"], ents["A"], k, c["n_val"], exclude=used_A[k])
        splits["val_id" + sfx] = [render("A", ch) for ch in chains]
        info["val_id" + sfx] = {"graph": "A", "hops": k, "train": False}
    if c["pad_left"]:  # last, from its own stream: the questions are the same with or without pads
        prng = np.random.default_rng([c["seed"], 2])
        for s in (s for s in splits if info[s]["train"]):
            splits[s] = [("_",) * int(n) + ex for ex, n in zip(splits[s], prng.integers(0, c["pad_left"] + 1, len(splits[s])))]
    meta = {"vocab": ents["A"] + ents["B"] + relations + ["_"] * (c["pad_left"] > 0), "entities": ents, "relations": relations,
            "splits": {s: {"file": f"{s}.txt", **info[s]} for s in splits},
            "config": {k: c[k] for k in GENERATOR_KEYS}}
    return splits, meta, graphs


def build_files(c):
    """The folder's files ({name: text}, one example per line) and meta.json's content: prepare_tools.prepare_qa writes them."""
    splits, meta, _ = build(c)
    return {f"{s}.txt": "".join(" ".join(ex) + "\n" for ex in exs) for s, exs in splits.items()}, meta


def prepare(c):
    """Prepare the dataset described by config dict c into c['out_dir'] (a no-op if this generator made it
    with this config; a folder it cannot prove it made is refused in one line and left untouched)."""
    check_config(c)
    return prepare_qa(c, "symbolic", GENERATOR_KEYS, build_files)


def main(argv):
    c, (verb, out) = cli(lambda c: prepare_and_say(prepare, c),
                         DEFAULTS, argv, __doc__, __file__, CHECKS)
    with open(os.path.join(out, "meta.json")) as f:
        meta = json.load(f)
    for s, info in meta["splits"].items():
        with open(os.path.join(out, info["file"])) as f:
            print(f"{s:16s} {sum(1 for _ in f):7d} examples  graph {info['graph']:2s} hops {info['hops']}")
    print(f"{verb} {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
