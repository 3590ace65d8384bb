#!/bin/bash
# train_atom again for the four runs made before probe.py left right padding out of the loops per token
cd /work/wt55
P="python probe.py exit --data_dir=/work/main/data/symbolic/pad2 --threads=1 --splits=train_atom"
D=/work/main/out/exit_disco; L=out/exit_loop
set -x
$P --ckpt=$D --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/atoms_disco_prob1.json
$P --ckpt=$L --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/atoms_loop_prob1.json
$P --ckpt=$D --exit_thresholds=0.5,0.9,0.99 --exit_min_loops=2 --json=out/exit/atoms_disco_prob2.json
$P --ckpt=$D --exit_rule=kl --exit_thresholds=0.01,0.1,1 --json=out/exit/atoms_disco_kl.json
timeout 900 python -m pytest -q -x tests/test_model.py tests/test_phi.py tests/test_ponder_reference.py tests/test_house.py
timeout 600 python -m pytest -q -x tests/test_probe.py -k exit_probe tests/test_eval_harness.py -k "adaptive or model_args or generate_until"
