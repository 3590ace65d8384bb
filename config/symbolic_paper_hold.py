# The paper's regime, second stage (RESULTS.md, arm P3): the vanilla loop of config/symbolic_paper.py branched at
# epoch 1,000 with the learning rate held at the value its cosine has there (1.6555e-3) instead of decaying it. Under
# the cosine the realignment's lift fades (0.8965 at epoch 1,250, 0.627 at 2,000); held, it rises (seed 0: 0.9595 at
# alpha 0.7 at epoch 2,000, all six of the criteria; seed 1: 0.8925 there, 0.978 at 2,500 and 0.9915 at the
# paper's 3,000 with --max_iters=78000). The branch starts fresh AdamW moments at the full lr from its first step
# (decay_lr=False has no warmup), and continues the source's weights and weight average. The recipe is two commands:
#   python train.py config/symbolic_paper.py --max_iters=39000        # epochs 0-1,000 (out/paper_loop)
#   python train.py config/symbolic_paper_hold.py                     # epochs 1,000-2,000 (out/paper_loop_const)
# A second seed passes the same --seed/--data_dir/--data_args to both, its own --out_dir to both and that folder's
# ckpt_39000.pt as --init_from to the second. --max_iters=78000 goes on to epoch 3,000.
# config/symbolic.py, as it is ...
out_dir = "out/symbolic"
dataset = "symbolic"
data_dir = "data/symbolic/out"
data_args = {"eval_hops": 4}         # evaluation-only 3- and 4-hop splits, for hop extrapolation
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
# ... and the paper regime's changes:
out_dir = "out/paper_loop"
recurrence = "loop"
label_smoothing = 0.0
max_iters = 78000                    # 2,000 epochs of 39 steps
lr_decay_iters = 78000               # the cosine over the whole run
eval_interval = 1950                 # 50 epochs
keep_every = 19500                   # a checkpoint every 500 epochs, for the probes
stop_metric = ""                     # the paper's state is a point on the way, not an end chosen by validation
stage1_splits = "all"
# ... and the branch's changes:
init_from = "out/paper_loop/ckpt_39000.pt"  # config/symbolic_paper.py's kept copy at epoch 1,000 (either horizon)
out_dir = "out/paper_loop_const"
learning_rate = 1.6555e-3            # the 2,000-epoch cosine's value at epoch 1,000, held
decay_lr = False
max_iters = 39000                    # 1,000 more epochs: epoch 2,000 in all
