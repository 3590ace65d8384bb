# Appendix A.2 in the paper's regime: the paper's joint 2+3-hop mix on its 3,000-epoch horizon, with the one change
# that put the vanilla loop into the paper's state on two hops (config/symbolic_paper.py): no label smoothing.
# This is also "the joint mix on today's recipe with label_smoothing=0": config/symbolic_paper.py changes nothing
# else, so one run answers both (RESULTS.md, "Appendix A.2"). With smoothing 0.1 DiscoLoop K = 3 plateaued at 3-hop
# ID 0.08 / OOD 0.01 from epoch 600 to 1,100; a memorized question at the smoothed optimum keeps no gradient.
#   python train.py config/symbolic3_paper.py                                            # DiscoLoop K = 3
#   python train.py config/symbolic3_paper.py --recurrence=loop --out_dir=out/symbolic3_paper_loop
#   python train.py config/symbolic3_paper.py --recurrence=none --out_dir=out/symbolic3_paper_flat
# config/symbolic3.py, as it is ...
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
# ... and the paper regime's changes:
out_dir = "out/symbolic3_paper"
label_smoothing = 0.0
split_join = {}                      # the paper's joint mix: every question from the start
max_iters = 117000                   # 3,000 epochs of 39 steps, the paper's A.2 horizon
lr_decay_iters = 117000              # the cosine over the whole run
eval_interval = 1950                 # 50 epochs
keep_every = 19500                   # a checkpoint every 500 epochs, for the probes
stop_metric = ""                     # a plateau is shown over 500 epochs, not chosen by validation
stage1_splits = "all"
