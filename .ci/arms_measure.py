"""Issue 67 item 3: what each training arm makes of the early loops, on the same validation windows for every run.
Per run and loop n = 1..K: validation loss (nats per token) of the head read after loop n, and how often loop n's top-1
equals loop K's (teacher-forced: every position of the windows, the true prefix); the training log's final val_loss
beside it. Each run's rows are printed and appended to --json the moment they are measured.

    python .ci/arms_measure.py RUN [RUN ...] [--windows=64] [--json=FILE] [--data_dir=the runs' own]
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from discoloop.checkpoint import load_checkpoint  # noqa: E402
from discoloop.bench_log import RowLog  # noqa: E402
from discoloop.common import ERRORS, ConfigError, check_writable  # noqa: E402
from run_args import refuse, runs_and_options  # noqa: E402
from discoloop.from_checkpoint import model_from_checkpoint  # noqa: E402
from discoloop.shards import TokenShards  # noqa: E402

runs, opts = runs_and_options(__doc__, __file__, {"windows": 64, "threads": 1, "json": "", "data_dir": ""})
W = opts["windows"]
torch.set_num_threads(opts["threads"])
HEADER = ["run", "final val_loss (log)"] + [f"loop {n}: loss, top-1 = loop K" for n in (1, 2, 3, 4)]


def final_val_loss(run):
    """The training log's last val_loss beside the checkpoint, or None (a checkpoint file alone, a log without one)."""
    folder = run if os.path.isdir(run) else os.path.dirname(run) or "."
    try:
        with open(os.path.join(folder, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError):
        return None
    return next((r["val_loss"] for r in reversed(rows) if isinstance(r, dict) and type(r.get("val_loss")) is float),
                None)


try:  # every run's checkpoint and validation shards, and the output, before the first is measured: one line each
    out = RowLog.check(opts["json"])  # a file not ours is left as it is: the rows go beside it
    if out:
        check_writable(out, "pass --json=FILE somewhere writable")
    opened = []
    for run in runs:
        ckpt = load_checkpoint(run)
        val = TokenShards(opts["data_dir"] or ckpt["config"]["data_dir"], "val")
        T = ckpt["model_args"]["block_size"]
        have = int((val.sizes[0] - 1) // T) if len(val.sizes) else 0  # windows of T + 1 tokens in the first shard
        if have < W:
            raise ConfigError(f"--windows={W} is invalid for {run!r}: its first validation shard holds {have} windows "
                              f"of {T} + 1 tokens: allowed 1..{have}")
        opened.append((run, ckpt, val))
except ERRORS as e:
    refuse(__file__, e)
log = RowLog(HEADER, out, {"script": "arms_measure.py", "windows": W})
for run, ckpt, val in opened:
    m = model_from_checkpoint(ckpt).eval()
    K, T = m.config.n_loop, m.config.block_size
    X, Y = val.windows(np.zeros(W, dtype=int), np.arange(W) * T, T)
    final = final_val_loss(run)
    loss, top = [], []
    with torch.no_grad():
        for n in range(1, K + 1):
            logits = torch.cat([m.head(m.hidden(X[i:i + 8], n_loop=n)).float() for i in range(0, W, 8)])
            loss.append(F.cross_entropy(logits.flatten(0, 1), Y.flatten()).item())
            top.append(logits.argmax(-1))
    agree = [(t == top[-1]).float().mean().item() for t in top]
    log.add(run, [os.path.basename(run.rstrip("/")), "-" if final is None else f"{final:.4f}",
                  *(f"{l:.3f}, {a:.1%}" for l, a in zip(loss, agree))],
            {"final_val_loss": final, "loop_loss": loss, "agree_with_K": agree, "windows": W})
