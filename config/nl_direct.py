# DiscoLoop on the synthetic natural-language two-hop task (Sec. 5.2), direct format:
# "Finley's teacher's wife is Charlie". K = 2 and the learned gate of Eq. (5), as in the paper.
# The model and optimizer are the symbolic recipe (config/symbolic.py). The graph is smaller than the
# paper's (100 instead of 500 entities per graph, so 2,000 atoms and 2,000 two-hop training questions,
# the same 20 training chains per bridge entity) because the paper's size costs ~37 s per epoch on
# 2 CPU cores; the full size is `--prepare_args="--format=direct --tiktoken_file=PATH"` plus a new
# data_dir. Batch 128 keeps ~31 optimizer steps per epoch; budget 300 epochs of a 450-epoch cosine.
exec(open("config/symbolic.py").read())
out_dir = "out/nl_direct"
dataset = "nl"
data_dir = "data/nl/direct"
prepare_args = "--format=direct --n_entities=100 --n_train=2000 --n_test=1000"  # + --tiktoken_file=PATH offline
block_size = 32
disco_gate = "learned"
batch_size = 128
max_iters = 9300         # 300 epochs x 31 steps
lr_decay_iters = 13950   # 450 epochs
eval_interval = 310      # 10 epochs
