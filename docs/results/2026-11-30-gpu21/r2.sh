#!/usr/bin/env bash
# Device run 3, right after r1 on the same machine (its kernels built): the prelude under
# the 32-client load in-process (step_anatomy --kernels: the step, the device's busy share,
# its idle time by the engine thread's phase), with and without; then issue 32's served
# table at this tree, ours against mlx_lm.server in one bench/serving.py run (32
# closed-loop clients, 500-1,000 in, 64-192 out, temperature 0.7, GPU busy over each
# load's window), and one greedy client.
set -u
source bench/device/prepare.sh
S=$OUT/a-summary.txt
source docs/results/2026-11-29-gpu19/lib.sh
model_8b >> $S
A="--model /tmp/l8b --input-len 500:1000 --mode host --launch --kernels"
sa c32-prelude 90 $A --clients 32 --output-len 64:192 --duration 20
sa c32-no-prelude 90 $A --clients 32 --output-len 64:192 --duration 20 --no-prelude
for f in /tmp/j/c32-*.json; do python3 -c "
import json,sys; h=json.load(open(sys.argv[1]))['host']; k=h['kernels']
print(sys.argv[1], h['tok_per_s'], h['ms_per_step'], k.get('busy_share'), k.get('kernels'), k.get('decode_steps'), k.get('idle_ms_by_phase'))" $f >> $S; done
T07="--mix temperature --temperature 0.7"
B="--model /tmp/l8b --server-concurrency 32 --input-len 500:1000 --ignore-eos"
run() {  # run NAME LIMIT ARGS...
  local name=$1 t=$2; shift 2
  timeout $t python3 -P bench/serving.py "$@" --out /tmp/j/$name.json > /tmp/j/$name.log 2>&1
  echo "== $name: rc=$? $(elapsed)" >> $S
  grep -E '^\| (ours|mlx_lm|ours/)|^GPU busy' /tmp/j/$name.log >> $S
}
run c32 300 --server ours --server mlx_lm $B --clients 32 --output-len 64:192 $T07 --duration 40 --warmup 8
[ $(( $(date +%s) - PREPARE_T0 )) -lt 500 ] && run one 80 --server ours $B --clients 1 --output-len 128 --mix greedy --duration 25 --warmup 1
cd /tmp/j && tar -czf $OUT/json.tgz *.json *.log && cd - > /dev/null
cat $S
