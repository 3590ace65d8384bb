# PonderLM baseline of Sec. 5.3 (Zeng et al. 2025, hzby/PonderingLM): config/pretrain.py's backbone, data
# and optimizer, with the recurrence in embedding space only: 4 full passes = 3 pondering steps. As the
# reference: exact Phi over the whole vocabulary (the paper prescribes top-k for DiscoLoop only), and
# its pretraining scripts' --scale_embeds true --mutiply_pondering_steps true. Exact Phi keeps
# (B, chunk, V) probabilities: with block checkpointing each Phi chunk is recomputed in backward.
#   torchrun --standalone --nproc_per_node=8 train.py config/pretrain_ponder.py
exec(open(sibling("pretrain.py")).read())  # config/pretrain.py, then PonderLM's changes:
out_dir = "out/pretrain_ponder"
recurrence = "ponder"
ponder_scale_embeds = True
ponder_multiply_steps = True
phi_topk = 0                         # exact Phi, as the reference
