# Three-hop extension (Appendix A.2): all atoms, 5,000 two-hop + 5,000 three-hop graph-A questions,
# four 1,000-question test splits ({2,3}-hop x {ID, OOD}); K = 3 loops, fixed alpha = 1, and
# otherwise config/symbolic.py's model and recipe on its whole 450-epoch cosine. One change: a
# curriculum. The 3-hop training questions join at iteration 6,630 (epoch 170), the first evaluation
# at which DiscoLoop's 2-hop validation accuracy reached 0.9 on seed 0 (RESULTS.md, "Three hops":
# trained from the start they are memorized before any composition exists; the paper's joint mix is
# --split_join={}). The rule itself, for other seeds or data: --split_join="{'train_id_3hop': 'acc/val_id>=0.9'}"
# (the run prints the iteration it fired at). Baselines, on the same recipe and the DiscoLoop run's
# join iteration (a rule on their own validation accuracy would never fire):
#   python train.py config/symbolic3.py --recurrence=loop --out_dir=out/symbolic3_loop
#   python train.py config/symbolic3.py --recurrence=none --out_dir=out/symbolic3_flat
exec(open(sibling("symbolic.py")).read())  # config/symbolic.py's model and recipe, then the three-hop changes:
out_dir = "out/symbolic3"
data_dir = "data/symbolic/hops3"
data_args = {"max_hops": 3, "n_test": 1000}
n_loop = 3
split_join = {"train_id_3hop": 6630}
stop_metric = ""                     # the whole 450-epoch cosine, no early stop
