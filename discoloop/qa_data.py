"""
Question-answer datasets (symbolic and natural-language two-hop): the folder format (written by
prepare_tools.write_qa, read by QAData), training batches in a resumable order, and exact-match accuracy with
Stage-1 read-out.

A prepared folder has meta.json ({"kind": "qa", "generator": "symbolic" | "nl", "vocab": [...],
"splits": {name: {"file", "graph", "hops", "train"}}, "checksums": {file: {"lines", "sha256"}},
"config": {...}}) and one text file per split, one example per line, tokens separated by spaces. The
answer is the last token, or everything after a tab when the line has one (multi-token answers).
Loss and accuracy cover only the answer tokens.
"""
import contextlib
import hashlib
import os

import numpy as np
import torch

from discoloop.common import DataError, read_unchanged
from discoloop.data_meta import kind_of, read_meta


def load_meta(data_dir, meta=None):
    """meta.json of a question-answer folder (or `meta`, read already), checked to be one (fields: data_meta.read_meta)."""
    meta = read_meta(data_dir) if meta is None else meta
    if kind_of(meta) != "qa":
        raise DataError(f"'{data_dir}' holds {kind_of(meta)!r} data, not question-answer splits")
    return meta


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def read_verified(path, expected):
    """The lines of a split file, after checking them against meta.json's count and sha256."""
    if not os.path.isfile(path):
        raise DataError(f"split file '{path}' is missing")
    raw = read_unchanged(path, read_bytes)  # checked by the prepare step and read by QAData: read once
    if expected is None:
        raise DataError(f"'{path}' has no checksum in meta.json (prepared by an older version): "
                        "delete the folder and prepare it again")
    lines = raw.count(b"\n")
    if lines != expected["lines"] or hashlib.sha256(raw).hexdigest() != expected["sha256"]:
        raise DataError(f"'{path}' does not match meta.json ({lines} lines, expected "
                        f"{expected['lines']}; or its checksum differs): the file is cut or changed, prepare it again")
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise DataError(f"'{path}' is not UTF-8 text") from None


def encode_split(path, stoi, expected=None):
    """-> (X, Y) long tensors (N, T): inputs right-padded with 0, targets -1 except answer tokens."""
    rows = []
    for lineno, line in enumerate(read_verified(path, expected), 1):
        question, _, answer = line.partition("\t") if "\t" in line else line.rpartition(" ")
        q, a = question.split(), answer.split()
        if not q or not a:
            raise DataError(f"{path}:{lineno}: expected a question and an answer, got {line!r}")
        try:
            rows.append(([stoi[t] for t in q], [stoi[t] for t in a]))
        except KeyError as e:
            raise DataError(f"{path}:{lineno}: token {e.args[0]!r} is not in the vocabulary") from None
    if not rows:
        raise DataError(f"split file '{path}' is empty")
    T = max(len(q) + len(a) - 1 for q, a in rows)
    X = torch.zeros(len(rows), T, dtype=torch.long)
    Y = torch.full((len(rows), T), -1, dtype=torch.long)
    for i, (q, a) in enumerate(rows):
        seq = q + a
        X[i, :len(seq) - 1] = torch.tensor(seq[:-1])
        Y[i, len(q) - 1:len(seq) - 1] = torch.tensor(a)  # position t predicts token t+1
    return X, Y


def pad_to(t, T, value):
    return torch.nn.functional.pad(t, (0, T - t.size(1)), value=value)


class QAData:
    """All splits of a prepared folder, as tensors (these datasets are small). The interface train.py
    uses, shared with shards.TokenData: vocab_size, config, seq_len, steps_per_epoch, get_batch, evaluate,
    metric_names."""

    kind = "qa"  # as meta.json names it (data_meta.KINDS): what train_config and tokenizer ask of opened data
    sparse_targets = True  # one answer token per question: the head runs on the answer rows alone (model.forward)

    def __init__(self, data_dir, block_size=None, split_join=None, stage1_splits="all", stage1_metrics=(),
                 loops_by_hops=False, extra_loops=0, meta=None):
        """stage1_splits, stage1_metrics: keep_stage1's; loops_by_hops: a k-hop question is trained and evaluated
        after k loops (atomic facts: 1); extra_loops: in training, each row gets 0..extra_loops loops more (its
        answer must survive them); meta: the folder's meta.json as read already (read once per dataset open)."""
        self.data_dir = data_dir
        self.meta = load_meta(data_dir, meta)
        self.stoi = {t: i for i, t in enumerate(self.meta["vocab"])}
        sums = self.meta.get("checksums", {})
        self.splits = {s: encode_split(os.path.join(data_dir, info["file"]), self.stoi, sums.get(info["file"]))
                       for s, info in self.meta["splits"].items()}
        self.train_splits = [s for s, info in self.meta["splits"].items() if info["train"]]
        if not self.train_splits:
            raise DataError(f"'{data_dir}' has no training split")
        T = max(self.splits[s][0].size(1) for s in self.train_splits)
        self.train_X = torch.cat([pad_to(self.splits[s][0], T, 0) for s in self.train_splits])
        self.train_Y = torch.cat([pad_to(self.splits[s][1], T, -1) for s in self.train_splits])
        # a curriculum: a training split may join the mix at a later iteration (split_join[name]; None =
        # not yet, set_join decides during the run, e.g. when a validation metric reaches a threshold)
        self.split_join = dict(split_join or {})
        for name, it in self.split_join.items():
            if name not in self.train_splits:
                raise DataError(f"split_join names {name!r}, not a training split of '{data_dir}': {self.train_splits}")
            if it is not None and (not isinstance(it, int) or it < 0):
                raise DataError(f"split_join[{name!r}]={it!r} must be an iteration (an integer >= 0) or None (not yet)")
        if len(self.split_join) == len(self.train_splits) and all(it != 0 for it in self.split_join.values()):
            raise DataError(f"split_join={self.split_join} leaves no training split in the mix at iteration 0")
        if block_size is not None and self.max_len > block_size:
            raise DataError(f"block_size={block_size} is shorter than the longest example ({self.max_len} tokens)")
        self.keep_stage1(stage1_splits, stage1_metrics)  # the splits whose Stage-1 accuracy evaluate() reports
        self.loops_by_hops, self.extra_loops = loops_by_hops, extra_loops
        self.train_hops = np.concatenate([np.full(len(self.splits[s][0]), self.hops(s)) for s in self.train_splits])
        self.set_join()

    def hops(self, split):
        return int(self.meta["splits"][split].get("hops", 1))

    def keep_stage1(self, prefixes, metrics=()):
        """Report Stage-1 accuracy only for splits whose name starts with one of `prefixes` (a comma list;
        'all' = every split) or that a metric named in `metrics` (the stop and join rules' metrics) is acc1/ of."""
        named = {m.split("/", 1)[1] for m in metrics if m.startswith("acc1/")}
        unknown = [p for p in prefixes.split(",") if prefixes != "all" and not any(s.startswith(p) for s in self.splits)]
        if unknown or not prefixes.strip():
            raise DataError(f"stage1_splits={prefixes!r}: {unknown[0] if unknown else 'it'!r} is no split's name or prefix "
                            f"here; allowed 'all' or a comma list of prefixes of {sorted(self.splits)}")
        self.stage1 = {s for s in self.splits if prefixes == "all" or s in named
                       or any(p and s.startswith(p) for p in prefixes.split(","))}

    def set_join(self, name=None, it=None):
        """Split `name` joins the mix at iteration `it` (train.py calls it when a join rule fires)."""
        if name is not None:
            self.split_join[name] = it
        join = {s: self.split_join.get(s, 0) for s in self.train_splits}
        never = np.iinfo(np.int64).max
        self.row_join = np.concatenate([np.full(len(self.splits[s][0]), never if join[s] is None else join[s])
                                        for s in self.train_splits])

    @property
    def config(self):
        return self.meta["config"]  # what generated the data: a resumed run must use the same

    @property
    def seq_len(self):
        return self.train_X.size(1)  # training batches are padded to the longest training example

    @property
    def vocab_size(self):
        return len(self.meta["vocab"])

    @property
    def max_len(self):
        return max(X.size(1) for X, _ in self.splits.values())

    def steps_per_epoch(self, global_batch):  # of the whole training set (a curriculum's late splits included)
        return max(1, len(self.train_X) // global_batch)

    def get_batch(self, it, global_batch, part, n_parts, seed):
        """Part `part` of `n_parts` of the global batch of iteration `it`: (x, y, loops), loops = each row's
        hop count (+ 0..extra_loops) with loops_by_hops, else None (model.forward's `loops`). The order is a pure
        function of (seed, epoch), so resuming at iteration `it` continues the exact same stream,
        and DDP ranks x micro-steps see the same examples as one process with accumulation."""
        joined = self.row_join <= it
        rows = np.flatnonzero(joined)  # the examples in the mix at this iteration
        start = int(self.row_join[joined].max())  # ... since this one (its phase's epochs count from here)
        spe = max(1, len(rows) // global_batch)
        epoch, step = divmod(it - start, spe)
        key = ([seed, epoch] if start == 0 else [seed, start, epoch], len(rows))
        if getattr(self, "_perm", (None,))[0] != key:  # drawn once an epoch, not once a step (most of a step's host time)
            self._perm = (key, np.random.default_rng(key[0]).permutation(len(rows)))
        perm = self._perm[1]
        idx = rows[perm[step * global_batch:(step + 1) * global_batch]]
        loops = None
        if self.loops_by_hops:  # extras drawn for the global batch, so every rank and micro-step agrees
            extra = np.random.default_rng([seed, it, 2]).integers(0, self.extra_loops + 1, len(idx))
            loops = torch.from_numpy(np.array_split(self.train_hops[idx] + extra, n_parts)[part])
        idx = torch.from_numpy(np.array_split(idx, n_parts)[part])
        return self.train_X[idx], self.train_Y[idx], loops

    @property
    def metric_names(self):  # what evaluate returns
        return [f"{m}/{s}" for s in self.splits for m in ("acc", "acc1", "loss") if m != "acc1" or s in self.stage1]

    def evaluate(self, model, batch_size, device="cpu", ctx=None, should_stop=None):
        return evaluate_splits(model, self, batch_size=batch_size, device=device, ctx=ctx, should_stop=should_stop)


@torch.no_grad()
def accuracy(model, X, Y, n_loop=None, batch_size=2048, hook=None, stage1=False, device="cpu", ctx=None,
             should_stop=None):
    """Exact match: a question is right when every answer token is the argmax (teacher-forced).
    Returns (final accuracy, Stage-1 accuracy or None, loss): Stage-1 reads the head off the state
    after loop 1 in the same forward pass; loss is the answer's cross-entropy (no smoothing), summed
    over its tokens and averaged over questions. `hook` is passed to model.forward (an intervention).
    None if should_stop() turns true before a batch: a stop request does not wait for the evaluation."""
    ctx = ctx or contextlib.nullcontext()
    right, right1, nll = 0, 0, 0.0
    for i in range(0, len(X), batch_size):
        if should_stop is not None and should_stop():
            return None
        x, y = X[i:i + batch_size].to(device), Y[i:i + batch_size].to(device)
        first = {}

        def grab(k, h, h_next):
            if k == 1:
                first["h"] = h
            return hook(k, h, h_next) if hook is not None else None

        with ctx:  # the head runs on the answer rows only (y != -1): the other positions have nothing to score
            h = model.hidden(x, n_loop=n_loop, hook=grab)
            rows, target = y != -1, y[y != -1]
            logits = model.head(h[rows])  # (answer tokens, V)
            ok = torch.ones_like(y, dtype=torch.bool)
            ok[rows] = logits.argmax(-1) == target
            right += ok.all(1).sum().item()
            nll += torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum").item()
            if stage1:
                ok[rows] = model.head(first["h"][rows]).argmax(-1) == target
                right1 += ok.all(1).sum().item()
    return right / len(X), (right1 / len(X) if stage1 else None), nll / len(X)


def evaluate_splits(model, data, n_loop=None, batch_size=2048, device="cpu", ctx=None, should_stop=None):
    """{'acc/<split>': final accuracy, 'acc1/<split>': Stage-1 accuracy (the splits in data.stage1),
    'loss/<split>'} for every split, after n_loop loops (a k-hop split after k with data.loops_by_hops); None if
    should_stop() turns true before a batch (an interrupted evaluation is abandoned)."""
    out = {}
    for s, (X, Y) in data.splits.items():
        K = data.hops(s) if data.loops_by_hops else n_loop
        res = accuracy(model, X, Y, n_loop=K, batch_size=batch_size, stage1=s in data.stage1, device=device, ctx=ctx,
                       should_stop=should_stop)
        if res is None:
            return None
        acc, acc1, loss = res
        out[f"acc/{s}"], out[f"loss/{s}"] = round(acc, 5), round(loss, 5)
        if acc1 is not None:
            out[f"acc1/{s}"] = round(acc1, 5)
    return out

