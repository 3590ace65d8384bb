# Three-hop extension (Appendix A.2): all atoms, 5,000 two-hop + 5,000 three-hop graph-A questions,
# four 1,000-question test splits ({2,3}-hop x {ID, OOD}); K = 3 loops, fixed alpha = 1.
exec(open("config/symbolic.py").read())
out_dir = "out/symbolic3"
data_dir = "data/symbolic/hops3"
prepare_args = "--max_hops=3 --n_test=1000"
n_loop = 3
