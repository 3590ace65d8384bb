# DiscoLoop on the paper's symbolic two-hop task (Sec. 5.1): fixed alpha = 1, tau = 1, K = 2.
# The model and recipe are train.py's defaults (one GPT-2-style block of d=192 with learned
# positions; AdamW lr 3e-3 cosine to 3e-4 over 450 epochs, wd 0.3, beta2 0.98, clip 1, label
# smoothing 0.1, batch 512) plus a weight average; the README says how they were chosen.
# The data has evaluation-only 3- and 4-hop splits for the hop-extrapolation probe.
out_dir = "out/symbolic"
dataset = "symbolic"
data_dir = "data/symbolic/out"
prepare_args = "--eval_hops=4"
recurrence = "disco"
disco_gate = "fixed"
disco_alpha = 1.0
disco_tau = 1.0
n_loop = 2
ema_decay = 0.999
