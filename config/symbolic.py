# DiscoLoop on the paper's symbolic two-hop task (Sec. 5.1): fixed alpha = 1, tau = 1, K = 2.
# Model and recipe: train.py's defaults (1 block of d=192, learned positions, AdamW lr 3e-3
# cosine to 3e-4, wd 0.3, beta2 0.98, clip 1, label smoothing 0.1, batch 512); see README.
out_dir = "out/symbolic"
dataset = "symbolic"
data_dir = "data/symbolic/out"
recurrence = "disco"
disco_gate = "fixed"
disco_alpha = 1.0
disco_tau = 1.0
n_loop = 2
