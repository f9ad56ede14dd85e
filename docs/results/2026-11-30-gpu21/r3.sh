#!/usr/bin/env bash
# Device run 2 of a fresh machine (the one r1 ran on was given back; part 1 staged, part 2
# carried). r1 found the bare 32-row step bound by the device, its decode attention (one
# block a row and key-value head at 32 rows) 5.4 of 11.1 ms a step, and the decode prelude
# a tie there. The 32-client load in-process (step_anatomy --kernels), after a short first
# process that builds the kernels: the tree as it is, the split attention form at 1,024
# target blocks, and (time left) without the decode prelude.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --kernels --clients 32 --output-len 64:192"
sa build 240 $A --duration 8
sa c32-default 90 $A --duration 20
sa c32-blocks1024 90 $A --duration 20 --attention-blocks 1024
[ $(( $(date +%s) - PREPARE_T0 )) -lt 480 ] && sa c32-no-prelude 90 $A --duration 20 --no-prelude
for f in /tmp/j/c32-*.json; do python3 -c "
import json,sys; h=json.load(open(sys.argv[1]))['host']; k=h['kernels']
print(sys.argv[1], h['tok_per_s'], h['ms_per_step'], k.get('busy_share'), k.get('kernels'), k.get('decode_steps'), k.get('idle_ms_by_phase'))" $f >> $S; done
cd /tmp/j && tar -czf $OUT/json.tgz c32-*.json c32-*.log && cd - > /dev/null
cat $S
