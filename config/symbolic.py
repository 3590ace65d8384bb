# DiscoLoop on the paper's symbolic two-hop task (Sec. 5.1): fixed alpha = 1, tau = 1, K = 2.
# The recipe: one GPT-2-style block of d=192 with learned positions (set below); train.py's
# optimizer defaults (AdamW lr 3e-3 cosine to 3e-4 over 450 epochs; wd 0.3, beta2 0.98, clip 1, label
# smoothing 0.1, batch 512) plus a weight average; RESULTS.md says how they were chosen. The run ends
# by the validation split alone: when val_id accuracy has not improved for 100 epochs (RESULTS.md,
# "An end point chosen without the test sets").
# Baselines of Fig. 3 are overrides of this file:
#   python train.py config/symbolic.py --recurrence=loop --out_dir=out/symbolic_loop
#   python train.py config/symbolic.py --recurrence=none --out_dir=out/symbolic_flat   # K untied copies
out_dir = "out/symbolic"
dataset = "symbolic"
data_dir = "data/symbolic/out"
data_args = {"eval_hops": 4}         # evaluation-only 3- and 4-hop splits, for hop extrapolation
vocab_size = 0                       # the dataset's vocabulary
block_size = 8                       # positions: the longest question (a 4-hop one) fits
# the model: one GPT-2-style block of d = 192 with learned positions (RESULTS.md: how it was chosen)
n_layer = 1
n_head = 6
n_embd = 192
pos_emb = "learned"
mlp = "gelu"                         # SwiGLU took the memorization route here
label_smoothing = 0.1
recurrence = "disco"
disco_gate = "fixed"
disco_alpha = 1.0
phi_tau = 1.0
n_loop = 2
ema_decay = 0.999
max_iters = 17550                    # the whole 450-epoch cosine at most ...
stop_metric = "acc/val_id"           # ... ending earlier when validation accuracy stalls
stop_patience = 10                   # evaluations (10 epochs each) without a new best
