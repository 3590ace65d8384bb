# Baseline for config/nl_direct.py: recurrence="loop", everything else the same.
exec(open("config/nl_direct.py").read())
out_dir = "out/nl_direct_loop"
recurrence = "loop"
