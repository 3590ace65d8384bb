# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The recipe is the symbolic one (config/symbolic.py); the README gives the budget and graph size.
exec(open("config/symbolic.py").read())
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
prepare_args = "--format=direct"     # add --tiktoken_file=PATH offline (README)
block_size = 32
disco_gate = "learned"
