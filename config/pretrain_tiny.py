# A tiny version of config/pretrain.py for CPU: the same code path (DDP, Muon, top-k Phi, shards,
# checkpointing), on a synthetic corpus generated offline with a byte-level tokenizer. Minutes on 2 cores:
#   python train.py config/pretrain_tiny.py
#   torchrun --standalone --nproc_per_node=2 train.py config/pretrain_tiny.py
exec(open(sibling("pretrain.py")).read())  # config/pretrain.py, then its tiny size:
out_dir = "out/pretrain_tiny"
data_dir = "data/pretrain/tiny"
data_args = {"data_files": "synthetic:web,synthetic:math", "encoding": "bytes", "max_tokens": 4_000_000,
             "val_tokens": 100_000, "shard_tokens": 1_000_000, "num_proc": 2}
vocab_size = 0                       # the data's: 257 byte tokens
block_size = 128
gradient_accumulation_steps = 2
n_layer = 2
n_head = 4
n_embd = 128
n_hidden = 0
scaled_init = True                   # GPT-2's init and no per-loop norm: config/pretrain.py took Ouro's
per_loop_norm = False                # after this file was made, and this file kept its own
phi_topk = 32
phi_chunk = 64
warmup_iters = 20
max_iters = 300
lr_decay_iters = 300
eval_interval = 100
eval_iters = 10
compile = False
