# DiscoLoop LM pretraining, paper Sec. 5.3 / Appendix B: the 440M Ouro-style looped backbone
# (d=1024, 24 layers, 16 heads, SwiGLU, RoPE theta=1e6, sandwich norm, tied embeddings, no biases),
# K=4, top-k Phi with k=128, on 20B tokens of 60% FineWeb-Edu + 40% FineMath-4plus.
#   torchrun --standalone --nproc_per_node=8 train.py config/pretrain.py
#   ... --recurrence=loop --out_dir=out/pretrain_loop          (vanilla loop baseline, Eq. 1)
#   PonderLM: config/pretrain_ponder.py (its recipe differs: exact Phi, the reference's embedding scalings)
# Tokens per step: 128 sequences x 8192 = 1,048,576; 19,074 steps = 20,000,538,624 tokens.
# Memory (python bench.py plan config/pretrain.py; measured with fake tensors, see README):
#   8 x 80 GB (this file): 8 sequences per GPU x 2 micro-steps, block checkpointing -> 43.3 GB per rank
#   16 x 80 GB, the paper's layout: --gradient_accumulation_steps=16 on 16 ranks (1 micro-step) -> 43.3 GB
#   8 x 141 GB (H200): --batch_size=16 --gradient_accumulation_steps=8 (1 micro-step) -> 79.3 GB
#   Without checkpointing one 8192-token sequence alone needs 59 GB of activations.
out_dir = "out/pretrain_disco"
dataset = "pretrain"
data_dir = "data/pretrain/shards"    # python data/pretrain/prepare.py (cl100k_base, see README)
vocab_size = 129280                  # the paper's (DeepSeek-V3) vocabulary size; cl100k_base uses the first 100,277 rows
block_size = 8192
batch_size = 8                       # sequences per GPU and micro-step
gradient_accumulation_steps = 16     # in total: 8 GPUs x 2, or 16 GPUs x 1 -> 128 sequences per step
activation_checkpointing = "block"   # keep each block's input only; ~31 GB of activations instead of ~470
loss_chunk = 1024                    # head + cross-entropy 1024 positions at a time: never (8, 8192, V) logits
n_layer = 24
n_head = 16
n_embd = 1024
n_hidden = 2816                      # Ouro's 2.75 x d SwiGLU width
norm = "rmsnorm"
mlp = "swiglu"
bias = False
pos_emb = "rope"
rope_theta = 1e6
sandwich_norm = True
scaled_init = False                  # Ouro's N(0, 0.02) for every Linear (README: fidelity table)
per_loop_norm = True                 # Ouro's forward: ln_f after every loop, the normed state feeds the next
dropout = 0.0
recurrence = "disco"
n_loop = 4
disco_gate = "fixed"
disco_alpha = 1.0
phi_tau = 1.0
phi_topk = 128
phi_chunk = 1024                   # decode Phi 1024 positions at a time: bounds the B x chunk x V logits
label_smoothing = 0.0
optimizer = "muon"                   # Muon on block matrices, AdamW (eps 1e-15) on embeddings/norms/gates
learning_rate = 3e-3
adam_eps = 1e-15
beta1 = 0.9
beta2 = 0.95
weight_decay = 0.1
muon_momentum = 0.95
grad_clip = 1.0
lr_schedule = "linear"
warmup_iters = 1000
max_iters = 19074
lr_decay_iters = 19074
min_lr = 1e-5
eval_interval = 500
eval_iters = 20
eval_batch_size = 8
log_interval = 10
compile = True
dtype = "auto"                       # bf16 on GPUs that have it
