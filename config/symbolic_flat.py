# Non-looped baseline: K untied copies of f_theta (same FLOPs), otherwise config/symbolic.py.
exec(open("config/symbolic.py").read())
out_dir = "out/symbolic_flat"
recurrence = "none"
