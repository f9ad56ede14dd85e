#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried), at the session's start:
# what the engine's own CUDA kernels cost a start (bench/custom_kernels.py in two fresh
# processes: the cold-start lever's size), then where the 32-client step's time goes on the
# host and on the device (step_anatomy --mode both: host phases, then the same load with the
# device synchronized around each phase), then a lone greedy stream the same way.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
for run in 1 2; do
  timeout 150 python3 -P bench/custom_kernels.py --out /tmp/j/custom-kernels-$run.json > /tmp/j/ck-$run.log 2>&1
  echo "== custom kernels $run: rc=$? $(elapsed)" >> $S; tail -12 /tmp/j/ck-$run.log >> $S
done
model_8b >> $S
sa c32 330 --model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode both --launch --duration 25
[ $(( $(date +%s) - PREPARE_T0 )) -lt 470 ] && sa one 110 --model /tmp/l8b --clients 1 --input-len 500:1000 --output-len 128 --temperature 0 --mode both --launch --duration 15
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
