# Reverse format of the natural-language two-hop task (Sec. 5.2):
# "Who is the wife of the teacher of Finley?\nAnswer: Charlie". Same model and recipe as
# config/nl_direct.py; only the data differ. Offline, add 'tiktoken_file': 'PATH' to data_args.
# Baselines: --recurrence=loop / --recurrence=none with their own --out_dir.
exec(open(sibling("nl_direct.py")).read())  # config/nl_direct.py, then the reverse format's data:
out_dir = "out/nl_reverse"
data_dir = "data/nl/reverse"
data_args = {"format": "reverse"}
