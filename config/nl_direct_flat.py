# Baseline for config/nl_direct.py: recurrence="none", everything else the same.
exec(open("config/nl_direct.py").read())
out_dir = "out/nl_direct_flat"
recurrence = "none"
