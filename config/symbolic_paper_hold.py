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
exec(open(sibling("symbolic_paper.py")).read())  # config/symbolic_paper.py, then the branch's changes:
init_from = "out/paper_loop/ckpt_39000.pt"  # config/symbolic_paper.py's kept copy at epoch 1,000 (either horizon)
out_dir = "out/paper_loop_const"
learning_rate = 1.6555e-3            # the 2,000-epoch cosine's value at epoch 1,000, held
decay_lr = False
max_iters = 39000                    # 1,000 more epochs: epoch 2,000 in all
