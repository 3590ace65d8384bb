# The GPU version of config/smollm2_continue.py: SmolLM2-1.7B continued as DiscoLoop (K = 2 over a looped middle) on
# FineWeb-Edu, for 8 GPUs. The weights come from the hub (this machine cannot reach it):
#   huggingface-cli download HuggingFaceTB/SmolLM2-1.7B --local-dir data/smollm2_1.7b
#   python data/pretrain/prepare.py --data_files=hf:HuggingFaceFW/fineweb-edu:sample-10BT --weights=1 \
#       --tokenizer_file=data/smollm2_1.7b/tokenizer.json --tokenizer_eot="<|endoftext|>" --max_tokens=300_000_000 \
#       --out_dir=data/pretrain/smollm2_fineweb
#   torchrun --standalone --nproc_per_node=8 train.py config/smollm2_1.7b_continue.py
# The architecture keys below are SmolLM2-1.7B's config.json (the folder's replace them at load; they are here so that
# `python bench.py plan config/smollm2_1.7b_continue.py` plans memory without the weights). The prelude / looped
# middle / coda split keeps the 135M model's measured proportions (12 / 6 / 12 of 30 layers -> 10 / 4 / 10 of 24).
out_dir = "out/smol17_disco"
init_from = "data/smollm2_1.7b"
dataset = "pretrain"
data_dir = "data/pretrain/smollm2_fineweb"
n_layer = 24
n_head = 32
n_kv_head = 32
n_embd = 2048
n_hidden = 8192
vocab_size = 49152
block_size = 2048
norm = "rmsnorm"
norm_eps = 1e-5
mlp = "swiglu"
bias = False
pos_emb = "rope"
rope_theta = 130000.0
tie_embeddings = True
recurrence = "disco"
n_loop = 2
n_prelude = 10
n_coda = 10
disco_alpha = 1.0
phi_topk = 128
activation_checkpointing = "block"
batch_size = 8
gradient_accumulation_steps = 8      # over 8 GPUs: 8 x 8 x 2,048 = 131,072 tokens per step
optimizer = "adamw"
learning_rate = 1e-4
min_lr = 1e-5
weight_decay = 0.0
beta2 = 0.95
grad_clip = 1.0
lr_schedule = "cosine"
warmup_iters = 100
max_iters = 2000                     # 262M tokens
lr_decay_iters = 2000
eval_interval = 200
eval_iters = 20
dtype = "bfloat16"
compile = True
