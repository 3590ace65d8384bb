# Appendix A.2 in the paper's regime: the paper's joint 2+3-hop mix on its 3,000-epoch horizon, with the one change
# that put the vanilla loop into the paper's state on two hops (config/symbolic_paper.py): no label smoothing.
# This is also "the joint mix on today's recipe with label_smoothing=0": config/symbolic_paper.py changes nothing
# else, so one run answers both (RESULTS.md, "Appendix A.2"). With smoothing 0.1 DiscoLoop K = 3 plateaued at 3-hop
# ID 0.08 / OOD 0.01 from epoch 600 to 1,100; a memorized question at the smoothed optimum keeps no gradient.
#   python train.py config/symbolic3_paper.py                                            # DiscoLoop K = 3
#   python train.py config/symbolic3_paper.py --recurrence=loop --out_dir=out/symbolic3_paper_loop
#   python train.py config/symbolic3_paper.py --recurrence=none --out_dir=out/symbolic3_paper_flat
exec(open(sibling("symbolic3.py")).read())  # config/symbolic3.py, then the paper regime's changes:
out_dir = "out/symbolic3_paper"
label_smoothing = 0.0
split_join = {}                      # the paper's joint mix: every question from the start
max_iters = 117000                   # 3,000 epochs of 39 steps, the paper's A.2 horizon, run whole (as in symbolic3.py):
                                     # a plateau is shown over 500 epochs, not chosen by validation
lr_decay_iters = 117000              # the cosine over the whole run
eval_interval = 1950                 # 50 epochs
keep_every = 19500                   # a checkpoint every 500 epochs, for the probes
stage1_splits = "all"
