"""
Token shards for LM pretraining: memmapped flat token files written by data/pretrain/prepare.py.
Training reads every token at most once per pass: the shards are cut into windows of block_size
tokens (plus the next token as the last target), which are visited in a seeded random order without
replacement; a new pass (epoch) draws a new order. Which windows a micro-batch gets is a pure function
of (seed, iteration, micro-batch), so resuming and DDP see exactly the batches one process would.
"""
import contextlib
import json
import os
import sys

import numpy as np
import torch

from discoloop.common import DataError, atomic_write, read_json
from discoloop.data_meta import read_meta


def check_whole(path, n_tokens, dtype):
    """A shard file holds the n_tokens its index says (a one-line DataError if it is missing or cut): for training,
    and for data/pretrain/prepare.py before it builds on shards it made earlier."""
    if not os.path.isfile(path):
        raise DataError(f"shard '{path}' is missing")
    if os.path.getsize(path) != n_tokens * np.dtype(dtype).itemsize:
        raise DataError(f"shard '{path}' is truncated: {os.path.getsize(path)} bytes, "
                        f"expected {n_tokens * np.dtype(dtype).itemsize}")


class TokenShards:
    def __init__(self, data_dir, split, meta=None):  # meta: meta.json as read already (once per dataset open)
        self.data_dir = data_dir
        self.meta = read_meta(data_dir) if meta is None else meta  # the one checked reader: shards, dtype, vocab_size
        if self.meta.get("kind") != "tokens":
            raise DataError(f"'{data_dir}' holds {self.meta.get('kind')!r} data, not token shards")
        files, dtype = self.meta["shards"].get(split, []), np.dtype(self.meta["dtype"])
        if not files:
            raise DataError(f"'{data_dir}' has no '{split}' shards")
        self.arrays = []
        cache = read_max_cache(data_dir)
        scanned = False
        for name, n_tokens in files:
            path = os.path.join(data_dir, name)
            check_whole(path, n_tokens, dtype)
            arr = np.memmap(path, dtype=dtype, mode="r")
            # every token is checked, not only the windows a run happens to sample; once per shard
            # file (80 GB at 20B tokens), then remembered by size and mtime in max_token.json
            st = os.stat(path)
            key = [st.st_size, st.st_mtime_ns]
            if cache.get(name, [None])[:2] == key:
                top = trusted_max(data_dir, name, arr, cache[name][2], self.meta["vocab_size"])
            else:
                top = max((int(arr[i:i + 2**24].max()) for i in range(0, len(arr), 2**24)), default=0)
                cache[name], scanned = key + [top], True
            if top >= self.meta["vocab_size"]:
                raise DataError(f"shard '{path}' holds token id {top}, outside the vocabulary ({self.meta['vocab_size']})")
            self.arrays.append(arr)
        self.sizes = np.array([len(a) for a in self.arrays])
        if scanned:  # otherwise the file already says it all (and DDP ranks need not rewrite it)
            write_max_cache(data_dir, cache)

    def check_window(self, block_size):
        if (self.sizes <= block_size).all():
            raise DataError(f"block_size={block_size} is longer than every shard of '{self.data_dir}' "
                            f"(the longest holds {self.sizes.max()} tokens): lower block_size")

    @property
    def vocab_size(self):
        return self.meta["vocab_size"]

    def get_batch(self, batch_size, block_size, seed):
        """Random windows (validation: the same ones at every evaluation); `seed` is a list of ints."""
        usable = np.maximum(self.sizes - block_size - 1, 0)  # check_window made sure some shard is long enough
        rng = np.random.default_rng(seed)
        shard = rng.choice(len(self.arrays), size=batch_size, p=usable / usable.sum())
        return self.windows(shard, (rng.random(batch_size) * usable[shard]).astype(np.int64), block_size)

    def windows(self, shard, start, T):
        """(x, y) long tensors (B, T): the windows at token `start` of each `shard` and their next tokens."""
        xy = torch.from_numpy(np.stack([np.asarray(self.arrays[s][i:i + T + 1], dtype=np.int64)
                                        for s, i in zip(shard, start)]))  # (B, T + 1); ids checked at load
        return xy[:, :-1], xy[:, 1:]


SPOT = 2**16  # tokens at each end of a shard checked against max_token.json's claim at every open


def trusted_max(data_dir, name, arr, claim, vocab_size):
    """The largest id max_token.json claims for a shard, once it survives two checks: the shard's first and last SPOT
    tokens hold none larger (a claim too small would let an id past the vocabulary reach the embedding), and a claim
    at or past the vocabulary is the shard's own (scanned again: the error path only). A claim shown false is one line
    naming max_token.json, the culprit, and how to remake it."""
    seen = max(int(arr[:SPOT].max(initial=0)), int(arr[-SPOT:].max(initial=0)))
    real = None
    if claim >= vocab_size:  # about to blame the shard: make sure it is the shard, not the cache
        real = max((int(arr[i:i + 2**24].max()) for i in range(0, len(arr), 2**24)), default=0)
    elif seen <= claim:
        return claim
    if real is not None and (real == claim or real >= vocab_size):
        return real  # the shard's own id: the shard is named
    path = os.path.join(data_dir, "max_token.json")
    holds = f"holds {real}" if real is not None else f"holds at least {seen}"
    raise DataError(f"'{path}' is wrong about shard '{name}': it says the largest token id is {claim}, the shard {holds} "
                    f"(the vocabulary: {vocab_size}); a stale or edited cache: delete '{path}' and the shards are "
                    "scanned again (it is remade) at the next start")


def read_max_cache(data_dir):
    """max_token.json: {shard file: [size, mtime_ns, largest id]}, the scan's memory. Missing is a first scan; any
    other shape (a list, a number, a torn entry) is one line, 'damaged: made again', and the shards scanned again."""
    path = os.path.join(data_dir, "max_token.json")
    if not os.path.exists(path):
        return {}
    try:
        cache = read_json(path)
        if all(isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v) for v in cache.values()):
            return cache
        why = "an entry is not [size, mtime, largest id]"
    except DataError as e:
        why = str(e)
    print(f"note: '{path}' is damaged ({why[:120]}): made again (the shards are scanned again)", file=sys.stderr)
    return {}


def write_max_cache(data_dir, cache):
    path = os.path.join(data_dir, "max_token.json")
    with contextlib.suppress(OSError):  # a read-only data folder: scan at every start instead
        atomic_write(path, json.dumps(cache))


class WindowOrder:
    """The training windows of some shards in a seeded order without replacement."""

    def __init__(self, sizes, T, seed):
        self.counts = np.maximum((sizes - 1) // T, 0)  # windows start at multiples of T and need T + 1 tokens
        self.first = np.concatenate([[0], np.cumsum(self.counts)])  # index of each shard's first window
        self.total, self.T, self.seed, self.cached = int(self.first[-1]), T, seed, (None, None)

    def perm(self, epoch):
        if self.cached[0] != epoch:
            self.cached = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.total))
        return self.cached[1]

    def __call__(self, positions):
        """Global window positions (0, 1, 2, ... over the whole run) -> (shard, start token) pairs."""
        epoch, k = np.divmod(positions, self.total)
        w = np.array([self.perm(e)[i] for e, i in zip(epoch, k)])
        shard = np.searchsorted(self.first, w, side="right") - 1
        return shard, (w - self.first[shard]) * self.T


class TokenData:
    """The train and val shards of a folder behind the interface train.py uses for every dataset
    (as qa_data.QAData): vocab_size, config, seq_len, steps_per_epoch, get_batch, evaluate, metric_names."""

    kind = "tokens"  # as meta.json names it (data_meta.KINDS)
    sparse_targets = False  # a target at every position

    def __init__(self, data_dir, block_size, eval_batches, seed=0, meta=None):
        self.train = TokenShards(data_dir, "train", meta)
        self.val = TokenShards(data_dir, "val", self.train.meta)  # meta.json read once per dataset open
        self.train.check_window(block_size)
        self.val.check_window(block_size)
        self.seq_len, self.eval_batches, self.seed = block_size, eval_batches, seed
        self.order = WindowOrder(self.train.sizes, block_size, seed)
        self.vocab_size = self.train.vocab_size
        self.config = self.train.meta.get("config", {})  # what generated the shards

    def steps_per_epoch(self, global_batch):
        return 0  # a token budget, not epochs

    def get_batch(self, it, global_batch, part, n_parts, seed):
        """Part `part` of `n_parts` of iteration `it`'s global batch: the next windows in the order,
        (x, y, None): long tensors (B, T), and no per-row loop counts (QAData's loops_by_hops)."""
        B = global_batch // n_parts
        shard, start = self.order(it * global_batch + part * B + np.arange(B))
        return *self.train.windows(shard, start, self.seq_len), None

    metric_names = ("val_loss",)  # what evaluate returns

    @torch.no_grad()
    def evaluate(self, model, batch_size, device="cpu", ctx=None, should_stop=None):
        """{'val_loss'} over the same eval_batches windows every time; None if should_stop() turns true."""
        losses = []
        for i in range(self.eval_batches):
            if should_stop is not None and should_stop():
                return None
            x, y = self.val.get_batch(batch_size, self.seq_len, [self.seed, 10**9, i])
            with ctx or contextlib.nullcontext():
                losses.append(model(x.to(device), y.to(device))[1].item())
        return {"val_loss": round(sum(losses) / len(losses), 5)}
