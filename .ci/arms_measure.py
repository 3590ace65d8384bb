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
from discoloop.common import ERRORS, check_writable  # noqa: E402
from run_args import runs_and_options  # noqa: E402
from discoloop.from_checkpoint import model_from_checkpoint  # noqa: E402
from discoloop.shards import TokenShards  # noqa: E402

runs, opts = runs_and_options(__doc__, __file__, {"windows": 64, "threads": 1, "json": "", "data_dir": ""})
W, out = opts["windows"], opts["json"]
torch.set_num_threads(opts["threads"])
try:  # every run's checkpoint and validation shards, and the output, before the first is measured: one line each
    if out:
        check_writable(out, "pass --json=FILE somewhere writable")
    opened = []
    for run in runs:
        ckpt = load_checkpoint(run)
        opened.append((run, ckpt, TokenShards(opts["data_dir"] or ckpt["config"]["data_dir"], "val")))
except ERRORS as e:
    sys.exit(f"arms_measure.py: {e}")
print("| run | final val_loss (log) | " + " | ".join(f"loop {n}: loss, top-1 = loop K" for n in (1, 2, 3, 4)) + " |")
for run, ckpt, val in opened:
    m = model_from_checkpoint(ckpt).eval()
    K, T = m.config.n_loop, m.config.block_size
    X, Y = val.windows(np.zeros(W, dtype=int), np.arange(W) * T, T)
    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
    final = [r["val_loss"] for r in rows if "val_loss" in r][-1]
    loss, top = [], []
    with torch.no_grad():
        for n in range(1, K + 1):
            logits = torch.cat([m.head(m.hidden(X[i:i + 8], n_loop=n)).float() for i in range(0, W, 8)])
            loss.append(F.cross_entropy(logits.flatten(0, 1), Y.flatten()).item())
            top.append(logits.argmax(-1))
    agree = [(t == top[-1]).float().mean().item() for t in top]
    print(f"| {os.path.basename(run.rstrip('/'))} | {final:.4f} | "
          + " | ".join(f"{l:.3f}, {a:.1%}" for l, a in zip(loss, agree)) + " |", flush=True)
    if out:
        with open(out, "a") as f:
            f.write(json.dumps({"run": run, "final_val_loss": final, "loop_loss": loss, "agree_with_K": agree,
                                "windows": W}) + "\n")
