# The anchors' recipe at full size, for a GPU (issue: "the paper's mechanistic story in the paper's regime"):
# GrokkedTransformer / Loop-Think-Generalize's GPT-2 blocks (LayerNorm, GELU, biases, learned positions, dropout
# 0.1), 4 blocks at d = 768 run twice (the vanilla loop, K = 2), AdamW lr 1e-4 constant after 2,000 warmup steps,
# wd 0.1, betas (0.9, 0.999), clip 1, batch 512, no label smoothing, no weight average. Everything else as
# config/symbolic.py (the same data). The memory and throughput plan: python bench.py plan config/symbolic_anchor.py
# --vocab_size=1050 --world_size=1 --gradient_accumulation_steps=1. One H100 runs it with .ci/gpu_symbolic.sh,
# which keeps a checkpoint every 500 epochs and probes each (Table 1(a), 1(b), Fig. 2).
exec(open(sibling("symbolic.py")).read())  # config/symbolic.py (its data, GELU, learned positions, K = 2), then:
out_dir = "out/symbolic_anchor"
n_layer = 4
n_head = 12
n_embd = 768
norm = "layernorm"
bias = True
dropout = 0.1
label_smoothing = 0.0
recurrence = "loop"
learning_rate = 1e-4
min_lr = 1e-4               # = learning_rate: warmup, then constant (decay_lr=False would skip the warmup)
warmup_iters = 2000
weight_decay = 0.1
beta2 = 0.999
ema_decay = 0.0
max_iters = 117000          # 3,000 epochs of 39 steps
eval_interval = 1950        # 50 epochs
keep_every = 19500          # a checkpoint to probe every 500 epochs
stop_metric = ""
stage1_splits = "all"
dtype = "bfloat16"
