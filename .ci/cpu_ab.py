"""Usage: python .ci/cpu_ab.py TREE (run it for /tmp/old, a worktree of the starting commit, and for the checkout, in turn). Eager CPU training-step time of one tree's model.py (argv[1]), for the A/B of 'nothing slows the CPU path':
the symbolic main job's model (config/symbolic.py: 1 GPT-2 block, d=192, K=2, batch 512 x 4 tokens, sparse targets)
and the tiny pretraining model (config/pretrain_tiny.py: 2 layers, d=128, K=2, top-32 Phi, block checkpointing,
batch 8 x 128). Prints median ms of 15 steps after 3, one thread."""
import statistics, sys, time
sys.path.insert(0, sys.argv[1])
import torch
torch.set_num_threads(1)
from model import GPT, GPTConfig
shapes = {
    "symbolic": (dict(n_layer=1, n_head=6, n_embd=192, pos_emb="learned", mlp="gelu", label_smoothing=0.1, recurrence="disco",
                      n_loop=2, block_size=8, vocab_size=2200), (512, 4), True),
    "pretrain_tiny": (dict(n_layer=2, n_head=4, n_embd=128, vocab_size=257, block_size=128, n_loop=2, phi_topk=32, phi_chunk=64,
                           sandwich_norm=True, activation_checkpointing="block"), (8, 128), False),
}
for name, (kw, (B, T), sparse) in shapes.items():
    torch.manual_seed(0)
    m = GPT(GPTConfig(**kw))
    x = torch.randint(0, kw["vocab_size"], (B, T))
    y = torch.full((B, T), -1); y[:, -1] = x[:, 0]
    if not sparse:
        y = x
    ts = []
    for i in range(18):
        t = time.perf_counter()
        _, loss = m(x, y, sparse_targets=sparse) if sparse else m(x, y)
        loss.backward(); m.zero_grad(set_to_none=True)
        ts.append(time.perf_counter() - t)
    print(name, round(1000 * statistics.median(ts[3:]), 2))
