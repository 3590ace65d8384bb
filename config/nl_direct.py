# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The paper's graph (500 entities per graph, 10,000 two-hop training questions) and exactly the
# symbolic recipe (config/symbolic.py: 300 epochs of 39 steps; the README's table stops at 150 with
# --max_iters=5850). The data defaults (one-token census names, a leading space so subject and
# answer are the same token) were chosen by measurement: without them nothing reaches OOD (README).
exec(open("config/symbolic.py").read())
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
prepare_args = "--format=direct"     # add --tiktoken_file=PATH offline (README)
block_size = 32
disco_gate = "learned"
