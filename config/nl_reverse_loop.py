# Baseline for config/nl_reverse.py: recurrence="loop", everything else the same.
exec(open("config/nl_reverse.py").read())
out_dir = "out/nl_reverse_loop"
recurrence = "loop"
