"""Usage: python .ci/symbolic_compile_ab.py. config/symbolic.py's model (1 GPT-2 block, d=192, K=2, exact Phi, batch 512 x 4, sparse answer targets): eager
against each Block compiled (compile=True), in one process, interleaved; one thread; fp32 and bf16 autocast."""
import os, statistics, sys, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import torch
torch.set_num_threads(1)
from model import GPT, GPTConfig
kw = dict(n_layer=1, n_head=6, n_embd=192, pos_emb="learned", mlp="gelu", label_smoothing=0.1, recurrence="disco",
          n_loop=2, block_size=8, vocab_size=2200)
torch.manual_seed(0)
eager = GPT(GPTConfig(**kw)); comp = GPT(GPTConfig(**kw)); comp.load_state_dict(eager.state_dict()); comp.compile_blocks()
x = torch.randint(0, 2200, (512, 4)); y = torch.full((512, 4), -1); y[:, -1] = x[:, 0]
for dt in (torch.float32, torch.bfloat16):
    ts = {"eager": [], "blocks": []}
    for i in range(23):
        for name, m in (("eager", eager), ("blocks", comp)):
            t = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dt == torch.bfloat16):
                _, loss = m(x, y, sparse_targets=True)
            loss.backward(); m.zero_grad(set_to_none=True)
            if i >= 3: ts[name].append(time.perf_counter() - t)
    e, b = statistics.median(ts["eager"]), statistics.median(ts["blocks"])
    print(f"{dt}: eager {1000*e:.1f} ms, per-block compiled {1000*b:.1f} ms, eager/compiled {e/b:.3f}x")
