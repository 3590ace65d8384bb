exec(open("config/symbolic3.py").read())
out_dir = "out/symbolic3_loop"
recurrence = "loop"
