"""Exits off is the model before adaptive depth, bit for bit, and not slower: this tree's model.py against OLD (a
model.py of an earlier commit, e.g. git show 71bae2a:model.py > /tmp/model_old.py), same weights, a forward of
4 x 256 tokens + 32 cached greedy tokens, round robin, 12 rounds, one thread. Usage: OLD=/tmp/model_old.py python
.ci/exit_speed.py"""
import importlib.util, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("model_old", os.environ["OLD"])
old = importlib.util.module_from_spec(spec); spec.loader.exec_module(old)
import model as new
for rec in ("disco", "loop"):
    kw = dict(block_size=256, vocab_size=2048, n_layer=2, n_head=4, n_embd=128, recurrence=rec, n_loop=3)
    torch.manual_seed(0); a = old.GPT(old.GPTConfig(**kw)).eval()
    torch.manual_seed(0); b = new.GPT(new.GPTConfig(**kw)).eval()
    x = torch.randint(0, 2048, (4, 256))
    with torch.no_grad():
        assert torch.equal(a.hidden(x), b.hidden(x)), "default path not bit-identical"
        p = x[:, :16]
        ga, gb = a.generate(p, 32, temperature=0), b.generate(p, 32, temperature=0)
        assert torch.equal(ga, gb)
        t = {"old": [], "new": []}
        for _ in range(12):  # round robin: forward + 32 cached greedy tokens
            for name, m in (("old", a), ("new", b)):
                s = time.perf_counter(); m.hidden(x); m.generate(p, 32, temperature=0); t[name].append(time.perf_counter() - s)
    mo, mn = statistics.median(t["old"]), statistics.median(t["new"])
    print(f"{rec}: median old {mo*1000:.1f} ms, new {mn*1000:.1f} ms, new/old = {mn/mo:.3f} (bit-identical outputs)")
