#!/usr/bin/env bash
# Prepared for the next session, not run: device run 2 of a fresh machine (part 1 staged,
# part 2 carried), after r5 has said which attention shape and compile are fastest alone.
# The same choices under the 32-client load, the engine in-process (step_anatomy --mode
# host --launch --kernels: the step, the device's busy share and its idle time by host
# phase), each in a process of its own after one that builds the kernels; edit the
# variants to r5's winners before running.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
A="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host --launch --kernels"
sa build 200 $A --duration 8
sa default 90 $A --duration 25
sa threads512 90 $A --duration 25 --attention-threads 512
sa vector-values 90 $A --duration 25 --attention-vector-values
sa mlxcompiles 90 $A --duration 25 --mlx-compiles
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && sa default-again 90 $A --duration 25
for f in /tmp/j/*.json; do python3 -c "
import json,sys; h=json.load(open(sys.argv[1]))['host']; k=h['kernels']
print(sys.argv[1], h['tok_per_s'], h['ms_per_step'], k.get('busy_share'), k.get('idle_ms_by_phase'))" $f >> $S; done
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
