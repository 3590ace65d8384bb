# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The paper's graph (500 entities per graph, 10,000 two-hop training questions) and the symbolic
# recipe (train.py's defaults, 300 epochs of 39 steps; RESULTS.md's table stops at 150 with
# --max_iters=5850). The data defaults (one-token census names, a leading space so subject and
# answer are the same token) were chosen by measurement (RESULTS.md). Offline, pass the GPT-2 ranks:
#   --data_args="{'format': 'direct', 'tiktoken_file': 'PATH'}"
# Baselines: --recurrence=loop / --recurrence=none with their own --out_dir.
exec(open(sibling("symbolic.py")).read())  # config/symbolic.py's model and recipe, then the NL changes:
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
data_args = {"format": "direct"}
block_size = 32
disco_gate = "learned"
max_iters = 11700                    # 300 epochs
stop_metric = ""                     # the end point of these runs was not chosen on validation yet
