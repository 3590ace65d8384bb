# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The paper's graph (500 entities per graph, 10,000 two-hop training questions) and exactly the
# symbolic recipe (config/symbolic.py: 300 epochs of 39 steps). A smaller graph is not cheaper in
# the way that matters: with 100 entities per graph every model memorized (README).
exec(open("config/symbolic.py").read())
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
prepare_args = "--format=direct"     # add --tiktoken_file=PATH offline (README)
block_size = 32
disco_gate = "learned"
