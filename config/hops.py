# Hop extrapolation (beyond the paper; RESULTS.md, "Hop extrapolation, second attempt"): train on atomic facts and
# 2-hop questions with one loop per hop, then answer 3- and 4-hop questions with 3 and 4 loops.
# The idea: loop k's job is the same at every hop ("read the entity one position back, apply my relation"):
#   - loops_by_hops: a fact is trained after 1 loop, a 2-hop question after 2, so loop 1 IS the one-hop circuit
#     and loop 2 must reuse it one position further on (DiscoLoop hands it the decoded bridge);
#   - RoPE: "one position back" is the same at every position;
#   - pad_left: training questions start after 0-2 '_' tokens, so the attention has seen 4-hop distances;
#   - the 2-hop questions join once loop 1 answers the facts (else loop 1 memorizes them: arm A);
#   - extra_loops: each question also trains with one loop more, so an answer is a fixed point (arm C).
# This file is arm C, the best of RESULTS.md's three (3-hop ID up to 0.55 with 3 loops; 4 hops not reached). Others:
#   arm A: --split_join={} --extra_loops=0 --n_loop=2      arm B: --extra_loops=0 --n_loop=2
exec(open(sibling("symbolic.py")).read())  # config/symbolic.py's model and recipe, then the hop changes:
out_dir = "out/hops"
data_dir = "data/symbolic/pad2"
data_args = {"eval_hops": 4, "pad_left": 2}
loops_by_hops = True
extra_loops = 1
split_join = {"train_id": "acc/train_atom>=0.99"}
pos_emb = "rope"
n_loop = 3                           # 2 hops + 1 extra loop
