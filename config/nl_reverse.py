# Reverse format of the natural-language two-hop task (Sec. 5.2):
# "Who is the wife of the teacher of Finley?\nAnswer: Charlie". Same model and recipe as
# config/nl_direct.py; only the data differ. Offline, add 'tiktoken_file': 'PATH' to data_args.
# Baselines: --recurrence=loop / --recurrence=none with their own --out_dir.
out_dir = "out/nl_reverse"
dataset = "nl"
data_dir = "data/nl/reverse"
data_args = {"format": "reverse"}
block_size = 32
# the model: one GPT-2-style block of d = 192 with learned positions (RESULTS.md: how it was chosen)
n_layer = 1
n_head = 6
n_embd = 192
pos_emb = "learned"
mlp = "gelu"                         # SwiGLU took the memorization route here
label_smoothing = 0.1
recurrence = "disco"
disco_gate = "learned"
disco_alpha = 1.0
phi_tau = 1.0
n_loop = 2
ema_decay = 0.999
max_iters = 11700                    # 300 epochs (the end point of these runs was not chosen on validation yet)
