# Reverse format: "Who is the wife of the teacher of Finley?\nAnswer: Charlie" (Sec. 5.2).
exec(open("config/nl_direct.py").read())
out_dir = "out/nl_reverse"
data_dir = "data/nl/reverse"
prepare_args = prepare_args.replace("--format=direct", "--format=reverse")
