# Default path (exits off) of this branch's model.py against the one before issue 55 (71bae2a), same weights, one run,
# round robin: python out/speed_default.py  (OLD=/tmp/old55/model_old.py)
import importlib.util, os, statistics, sys, time
import torch
sys.path.insert(0, os.getcwd())
torch.set_num_threads(1)
spec = importlib.util.spec_from_file_location("model_old", os.environ.get("OLD", "/tmp/old55/model_old.py"))
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
