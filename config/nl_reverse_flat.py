# Baseline for config/nl_reverse.py: recurrence="none", everything else the same.
exec(open("config/nl_reverse.py").read())
out_dir = "out/nl_reverse_flat"
recurrence = "none"
