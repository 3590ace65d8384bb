# Three-hop extension (Appendix A.2): all atoms, 5,000 two-hop + 5,000 three-hop graph-A questions,
# four 1,000-question test splits ({2,3}-hop x {ID, OOD}); K = 3 loops, fixed alpha = 1, and
# otherwise the symbolic recipe (train.py's defaults) on its 450-epoch cosine. One change: a
# curriculum. The 3-hop training questions join at iteration 6,630 (epoch 170), the first evaluation
# at which DiscoLoop's 2-hop validation accuracy reached 0.9 on seed 0 (RESULTS.md, "Three hops":
# trained from the start they are memorized before any composition exists; the paper's joint mix is
# --split_join={}). The rule itself, for other seeds or data: --split_join="{'train_id_3hop': 'acc/val_id>=0.9'}"
# (the run prints the iteration it fired at). Baselines, on the same recipe and the DiscoLoop run's
# join iteration (a rule on their own validation accuracy would never fire):
#   python train.py config/symbolic3.py --recurrence=loop --out_dir=out/symbolic3_loop
#   python train.py config/symbolic3.py --recurrence=none --out_dir=out/symbolic3_flat
out_dir = "out/symbolic3"
dataset = "symbolic"
data_dir = "data/symbolic/hops3"
data_args = {"max_hops": 3, "n_test": 1000}
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
n_loop = 3
ema_decay = 0.999
split_join = {"train_id_3hop": 6630}
