#!/usr/bin/env bash
# Prepared for the next session, not yet run (this session's device time was spent): device
# run 2 of a fresh machine (part 1 staged, part 2 and .whl/spy carried), issue 32. Where the
# served decode step's launch (13.7-14.3 ms a step at 32 clients, in-process, call 7) goes
# beyond the same step alone (5.1-6.4 ms): py-spy --native --idle at 50 Hz on the engine
# in-process under 32 clients (MLX's CUDA graphs off, as the engine has them), then on
# bench/batch_step.py's bare step (ours only, 32 rows, 500-1,000 tokens of context), each
# summarized inside async_eval (spy_summary.py). Llama-3.1-8B, bf16.
set -u
cp .whl/spy/* /tmp/stage/ 2>/dev/null
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy /tmp/stage/py_spy-*.whl >> $S 2>&1
D=docs/results/2026-11-29-gpu16
L="--model /tmp/l8b --clients 32 --input-len 500:1000 --output-len 64:192 --mode host"
mkdir -p /tmp/j
PROBE_OUT=/tmp/j/warm-pool.json timeout 240 python3 -P $D/pool.py $L --duration 10 --out /tmp/j/warm.json > /tmp/j/warm.log 2>&1
echo "== warm: rc=$? $(elapsed)" >> $S
SPY=15:30 SPY_OUT=/tmp/j/spy-served.txt PROBE_OUT=/tmp/j/served-pool.json timeout 150 \
  python3 -P $D/pool.py $L --duration 40 --out /tmp/j/served.json > /tmp/j/served.log 2>&1
echo "== served: rc=$? $(elapsed)" >> $S
python3 $D/spy_summary.py /tmp/j/spy-served.txt Worker._loop > $OUT/spy-served.txt 2>&1
head -1 $OUT/spy-served.txt >> $S
timeout 200 python3 -P bench/batch_step.py --model /tmp/l8b --rows 32 --context 500:1000 \
  --steps 3000 --warmup 16 --variants ours --out /tmp/j/bare.json > /tmp/j/bare.log 2>&1 &
BP=$!
sleep 45
/tmp/spy/bin/py-spy record -p $BP -d 15 -r 50 --native --idle --threads -f raw -o /tmp/j/spy-bare.txt > /dev/null 2>&1
wait $BP; echo "== bare: rc=$? $(elapsed)" >> $S
python3 $D/spy_summary.py /tmp/j/spy-bare.txt MainThread > $OUT/spy-bare.txt 2>&1
head -1 $OUT/spy-bare.txt >> $S
cd /tmp/j && tar -czf $OUT/json.tgz *.json spy-*.txt && cd - > /dev/null
cat $S
