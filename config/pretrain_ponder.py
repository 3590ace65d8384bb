# PonderLM baseline of Sec. 5.3: 4 full passes = 3 pondering steps; same top-k Phi as DiscoLoop.
exec(open("config/pretrain.py").read())
out_dir = "out/pretrain_ponder"
recurrence = "ponder"
