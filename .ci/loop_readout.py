"""What the head reads after each loop of a pretraining run (RESULTS.md, "Language: validation loss and a zero-shot
score against depth"): over 32 validation windows, how often its argmax is the next token, or the current one, and its
mean top probability. Usage: python .ci/loop_readout.py RUN [RUN ...]"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from discoloop.checkpoint import load_checkpoint  # noqa: E402
from discoloop.from_checkpoint import model_from_checkpoint  # noqa: E402
from discoloop.shards import TokenShards  # noqa: E402

torch.set_num_threads(1)
for run in sys.argv[1:]:
    ckpt = load_checkpoint(run)
    m = model_from_checkpoint(ckpt).eval()
    T = m.config.block_size
    X, Y = TokenShards(ckpt["config"]["data_dir"], "val").windows(np.zeros(32, dtype=int), np.arange(32) * T, T)
    with torch.no_grad():
        for n in range(1, m.config.n_loop + 1):
            p = m.head(m.hidden(X, n_loop=n)).float().softmax(-1)
            a = p.argmax(-1)
            print(f"{run} after loop {n}: argmax is the next token {(a == Y).float().mean():.3f}, the current one "
                  f"{(a == X).float().mean():.3f}; mean top probability {p.amax(-1).mean():.3f}")
