#!/bin/bash
# the adaptive-depth measurement, in order, after the vanilla-loop control's training ends
cd /work/wt55
while pgrep -f "out_dir=out/exit_loop" > /dev/null; do sleep 5; done
P="python probe.py exit --data_dir=/work/main/data/symbolic/pad2 --threads=1 --splits=train_atom,test_id,test_ood,test_id_3hop,test_ood_3hop"
D=/work/main/out/exit_disco; L=out/exit_loop
set -x
date -u
$P --ckpt=$D --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/disco_prob1.json --png=assets/exit_disco_prob.png
$P --ckpt=$L --exit_thresholds=0.5,0.9,0.99,0.999 --json=out/exit/loop_prob1.json --png=assets/exit_loop_prob.png
$P --ckpt=$D --exit_thresholds=0.5,0.9,0.99 --exit_min_loops=2 --json=out/exit/disco_prob2.json
$P --ckpt=$D --exit_rule=kl --exit_thresholds=0.01,0.1,1 --json=out/exit/disco_kl.json
$P --ckpt=$L --exit_thresholds=0.5,0.9,0.99 --exit_min_loops=2 --json=out/exit/loop_prob2.json
$P --ckpt=$D --n_loop=4 --exit_thresholds=0.9,0.99 --exit_min_loops=2 --json=out/exit/disco_k4.json
$P --ckpt=$L --n_loop=4 --exit_thresholds=0.9,0.99 --exit_min_loops=2 --json=out/exit/loop_k4.json
python out/speed_default.py
date -u
