# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The paper's graph (500 entities per graph, 10,000 two-hop training questions) and the symbolic
# recipe (train.py's defaults, 300 epochs of 39 steps; RESULTS.md's table stops at 150 with
# --max_iters=5850). The data defaults (one-token census names, a leading space so subject and
# answer are the same token) were chosen by measurement (RESULTS.md). Offline, pass the GPT-2 ranks:
#   --data_args="{'format': 'direct', 'tiktoken_file': 'PATH'}"
# Baselines: --recurrence=loop / --recurrence=none with their own --out_dir.
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
data_args = {"format": "direct"}
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
