# Vanilla looped baseline (Eq. 1): config/symbolic.py with only the recurrence changed.
exec(open("config/symbolic.py").read())
out_dir = "out/symbolic_loop"
recurrence = "loop"
