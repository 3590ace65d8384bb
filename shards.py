"""
Token shards for LM pretraining: memmapped flat token files written by data/pretrain/prepare.py,
read as random windows. A window's position is a pure function of (seed, iteration, micro-batch),
so resuming and DDP see exactly the batches a single process would.
"""
import json
import os

import numpy as np
import torch

from tasks import DataError


class TokenShards:
    def __init__(self, data_dir, split):
        self.data_dir = data_dir
        meta_path = os.path.join(data_dir, "meta.json")
        if not os.path.isfile(meta_path):
            raise DataError(f"no prepared token shards at '{data_dir}' (missing meta.json)")
        try:
            with open(meta_path) as f:
                self.meta = json.load(f)
            files = self.meta["shards"].get(split, [])
            dtype = np.dtype(self.meta["dtype"])
            self.meta["vocab_size"]
        except json.JSONDecodeError as e:
            raise DataError(f"'{meta_path}' is not valid JSON ({e.msg} at line {e.lineno}): prepare the shards again") from None
        except (KeyError, TypeError, AttributeError) as e:
            raise DataError(f"'{meta_path}' lacks {e} (not a complete shard index): prepare the shards again") from None
        if not files:
            raise DataError(f"'{data_dir}' has no '{split}' shards")
        self.arrays = []
        for name, n_tokens in files:
            path = os.path.join(data_dir, name)
            if not os.path.isfile(path):
                raise DataError(f"shard '{path}' is missing")
            if os.path.getsize(path) != n_tokens * dtype.itemsize:
                raise DataError(f"shard '{path}' is truncated: {os.path.getsize(path)} bytes, "
                                f"expected {n_tokens * dtype.itemsize}")
            arr = np.memmap(path, dtype=dtype, mode="r")
            # every token checked once here, not only the windows a run happens to sample
            top = max((int(arr[i:i + 2**24].max()) for i in range(0, len(arr), 2**24)), default=0)
            if top >= self.meta["vocab_size"]:
                raise DataError(f"shard '{path}' holds token id {top}, outside the vocabulary ({self.meta['vocab_size']})")
            self.arrays.append(arr)
        self.sizes = np.array([len(a) for a in self.arrays])

    def check_window(self, block_size):
        if (self.sizes <= block_size).all():
            raise DataError(f"block_size={block_size} is longer than every shard of '{self.data_dir}' "
                            f"(the longest holds {self.sizes.max()} tokens): lower block_size")

    @property
    def vocab_size(self):
        return self.meta["vocab_size"]

    def get_batch(self, batch_size, block_size, seed):
        """(x, y) long tensors (B, T) of random windows; `seed` is a list of ints (SeedSequence)."""
        usable = np.maximum(self.sizes - block_size - 1, 0)
        if usable.sum() == 0:
            raise DataError(f"every shard is shorter than block_size+1={block_size + 1} tokens")
        rng = np.random.default_rng(seed)
        shard = rng.choice(len(self.arrays), size=batch_size, p=usable / usable.sum())
        starts = (rng.random(batch_size) * usable[shard]).astype(np.int64)
        rows = [np.asarray(self.arrays[s][i:i + block_size + 1], dtype=np.int64) for s, i in zip(shard, starts)]
        xy = torch.from_numpy(np.stack(rows))
        if xy.max().item() >= self.vocab_size:
            raise DataError(f"token id {xy.max().item()} is outside the vocabulary ({self.vocab_size})")
        return xy[:, :-1], xy[:, 1:]
