# The GPU version of config/smollm2_continue.py: SmolLM2-1.7B continued as DiscoLoop (K = 2 over a looped middle) on
# FineWeb-Edu, for 8 GPUs. The weights come from the hub (this machine cannot reach it):
#   huggingface-cli download HuggingFaceTB/SmolLM2-1.7B --local-dir data/smollm2_1.7b
#   python data/pretrain/prepare.py --data_files=hf:HuggingFaceFW/fineweb-edu:sample-10BT --weights=1 \
#       --tokenizer_file=data/smollm2_1.7b/tokenizer.json --tokenizer_eot="<|endoftext|>" --max_tokens=300_000_000 \
#       --out_dir=data/pretrain/smollm2_fineweb
#   torchrun --standalone --nproc_per_node=8 train.py config/smollm2_1.7b_continue.py
# The architecture keys below, with the 135M's that they keep, are SmolLM2-1.7B's config.json (the folder decides: a
# value that differs is refused; they are here so that `python bench.py plan config/smollm2_1.7b_continue.py` plans memory without the
# weights). The prelude / looped middle / coda split keeps the 135M model's measured proportions (12 / 6 / 12 of 30
# layers -> 10 / 4 / 10 of 24).
exec(open(sibling("smollm2_continue.py")).read())  # config/smollm2_continue.py's recurrence and recipe, then:
out_dir = "out/smol17_disco"
init_from = "data/smollm2_1.7b"
data_dir = "data/pretrain/smollm2_fineweb"
data_args = {}                       # the folder is prepared by the prepare.py command above
n_layer = 24
n_head = 32
n_kv_head = 32
n_embd = 2048
n_hidden = 8192
rope_theta = 130000.0
block_size = 2048
n_prelude = 10
n_coda = 10
activation_checkpointing = "block"
batch_size = 8
gradient_accumulation_steps = 8      # over 8 GPUs: 8 x 8 x 2,048 = 131,072 tokens per step
warmup_iters = 100
max_iters = 2000                     # 262M tokens
lr_decay_iters = 2000
eval_interval = 200
eval_iters = 20
eval_batch_size = 2048               # train.py's default, as this file always had it (not run yet)
log_interval = 10
dtype = "bfloat16"
compile = True
