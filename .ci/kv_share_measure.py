"""Issue 74's measurement: what each loop's attention reads for earlier positions (model.KV_SHARES), on trained runs,
at inference: the validation loss (token runs) or the accuracy per split (question-answer runs) with each kv_share,
and the key/value bytes per token each keeps (fp32). Every row printed and appended to --json as it is measured.

    python .ci/kv_share_measure.py RUN [RUN ...] [--windows=16] [--threads=2] [--json=FILE]

'' and 'first' are read in one parallel forward (equal to cached decoding: tests/test_kv_share.py); 'latest' exists
only in decoding, so it is read a position a call through the cache (GPT.hidden_stepwise) on the same windows.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from run_args import refuse, runs_and_options  # noqa: E402

MODES = ("", "first", "latest")


def kv_bytes(cfg):
    """Key/value bytes per token of context in fp32: one slot per (loop, layer) the forward uses, or per layer."""
    looped = cfg.n_layer - cfg.n_prelude - cfg.n_coda
    slots = cfg.n_layer if cfg.kv_share else cfg.n_prelude + cfg.n_coda + looped * cfg.n_loop
    return slots * 2 * (cfg.n_kv_head or cfg.n_head) * (cfg.n_embd // cfg.n_head) * 4


@torch.no_grad()
def hidden(model, x):
    return model.hidden_stepwise(x) if model.config.kv_share == "latest" else model.hidden(x)


@torch.no_grad()
def token_loss(model, val, W):
    T = model.config.block_size
    X, Y = val.windows(np.zeros(W, dtype=int), np.arange(W) * T, T)
    logits = torch.cat([model.head(hidden(model, X[i:i + 8])) for i in range(0, W, 8)]).float()
    return F.cross_entropy(logits.flatten(0, 1), Y.flatten()).item()


@torch.no_grad()
def qa_accuracy(model, data, split, n=2000):
    X, Y = data.splits[split]
    X, Y = X[:n], Y[:n]
    h = torch.cat([hidden(model, X[i:i + 500]) for i in range(0, len(X), 500)])
    keep = Y != -1
    pred = model.head(h[keep]).argmax(-1)
    return (pred == Y[keep]).float().mean().item()


def main():
    runs, opts = runs_and_options(__doc__, __file__, {"windows": 16, "threads": 2, "json": "",
                                                      "splits": "test_id,test_ood,test_id_3hop,test_ood_3hop"})
    from discoloop.bench_log import RowLog
    from discoloop.checkpoint import load_checkpoint
    from discoloop.common import ERRORS, check_writable
    from discoloop.from_checkpoint import load, model_from_checkpoint
    torch.set_num_threads(opts["threads"])
    try:
        out = RowLog.check(opts["json"])
        if out:
            check_writable(out, "pass --json=FILE somewhere writable")
        opened = [(run, load_checkpoint(run), load(run, tokens_ok=True)[1]) for run in runs]
    except ERRORS as e:
        refuse(__file__, e)
    log = RowLog(["run", "trained with", "kv_share at inference", "val loss / accuracy", "KV bytes per token"], out,
                 {"script": "kv_share_measure.py", **opts})
    for run, ckpt, data in opened:
        name, trained = os.path.basename(run.rstrip("/")), ckpt["model_args"].get("kv_share", "")
        for mode in MODES:
            model = model_from_checkpoint(ckpt, kv_share=mode).eval()
            if hasattr(data, "windows"):
                score = token_loss(model, data, opts["windows"])
                shown = f"{score:.4f}"
            else:
                splits = [s for s in opts["splits"].split(",") if s in data.splits]
                score = {s: qa_accuracy(model, data, s) for s in splits}
                shown = ", ".join(f"{s} {v:.4f}" for s, v in score.items())
            log.add(f"{name} {mode or 'own'}", [name, repr(trained), repr(mode), shown, f"{kv_bytes(model.config):,}"],
                    {"run": run, "trained": trained, "mode": mode, "score": score, "kv_bytes": kv_bytes(model.config)})


if __name__ == "__main__":
    main()
