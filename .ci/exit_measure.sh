#!/usr/bin/env bash
# The adaptive-depth measurement of RESULTS.md ("Adaptive depth"): probe.py exit on the config/hops.py runs, DiscoLoop
# (out/exit_disco) and the vanilla loop (out/exit_loop), each trained by
#   timeout -s TERM 2400 python train.py config/hops.py [--recurrence=loop] --out_dir=out/exit_R --threads=1
# JSON results land in out/exit/. Usage: bash .ci/exit_measure.sh
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p out/exit
P="python probe.py exit --data_dir=data/symbolic/pad2 --threads=1"
S="--splits=train_atom,test_id,test_ood,test_id_3hop,test_ood_3hop"
D=out/exit_disco; L=out/exit_loop
set -x
$P $S --ckpt=$D --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/disco_prob1.json --png=assets/exit_disco_prob.png
$P $S --ckpt=$L --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/loop_prob1.json --png=assets/exit_loop_prob.png
$P $S --ckpt=$D --exit_thresholds=0.5,0.9,0.99 --exit_min_loops=2 --json=out/exit/disco_prob2.json
$P $S --ckpt=$D --exit_rule=kl --exit_thresholds=0.01,0.1,1 --json=out/exit/disco_kl.json
$P $S --ckpt=$L --exit_thresholds=0.5,0.9,0.99 --exit_min_loops=2 --json=out/exit/loop_prob2.json
$P $S --ckpt=$D --n_loop=4 --exit_thresholds=0.9,0.99 --exit_min_loops=2 --json=out/exit/disco_k4.json
$P $S --ckpt=$L --n_loop=4 --exit_thresholds=0.9,0.99 --exit_min_loops=2 --json=out/exit/loop_k4.json
