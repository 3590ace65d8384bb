# Vanilla looped baseline of Sec. 5.3: config/pretrain.py with the plain recurrence (Eq. 1).
exec(open("config/pretrain.py").read())
out_dir = "out/pretrain_loop"
recurrence = "loop"
