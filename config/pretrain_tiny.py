# A tiny version of config/pretrain.py for CPU: same code path (DDP, Muon, top-k Phi, shards),
# on a synthetic corpus generated offline and a byte-level tokenizer. Minutes on 2 cores:
#   python train.py config/pretrain_tiny.py
#   torchrun --standalone --nproc_per_node=2 train.py config/pretrain_tiny.py
exec(open("config/pretrain.py").read())
out_dir = "out/pretrain_tiny"
data_dir = "data/pretrain/tiny"
prepare_args = ("--data_files=synthetic:web,synthetic:math --encoding=bytes --max_tokens=4000000 "
                "--val_tokens=100000 --shard_tokens=1000000 --num_proc=2")
vocab_size = 0
block_size = 128
batch_size = 8
gradient_accumulation_steps = 2
n_layer = 2
n_head = 4
n_embd = 128
n_hidden = 0
disco_topk = 32
disco_chunk = 64
warmup_iters = 20
max_iters = 300
lr_decay_iters = 300
eval_interval = 100
eval_iters = 10
compile = False
