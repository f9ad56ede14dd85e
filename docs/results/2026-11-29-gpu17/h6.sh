#!/usr/bin/env bash
# Ran 2026-11-29 19:50 UTC (the next session): docs/results/2026-11-29-gpu18/call-3/.
# Prepared for the next session, not run: on a machine that ran h5.sh (kernels built, the
# model made; carry .whl/spy), issue 32's one client (>= 150 tok/s; 126.7 measured at TPOT
# 7.7 ms, benchmarks.md): where a lone served stream's step goes, py-spy --native --idle at
# 50 Hz for 12 s on the server's engine thread under one greedy streaming client, in its
# steady state (attached 10 s into the load, not during the start-up as h1's was).
set -u
mkdir -p /tmp/stage && cp .whl/spy/* /tmp/stage/ 2>/dev/null
source bench/device/prepare.sh
S=$OUT/a-summary.txt
model_8b >> $S
[ -x /tmp/spy/bin/py-spy ] || python3 -m pip install -q --no-index --no-deps --target /tmp/spy /tmp/stage/py_spy-*.whl >> $S 2>&1
mkdir -p /tmp/g
health() { python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null; }
python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 > /tmp/g/one.server.log 2>&1 &
s=$(date +%s); for i in $(seq 1 1600); do health && break; sleep 0.25; done
echo "== ready after $(( $(date +%s) - s )) s ($(elapsed))" >> $S
SP=$(pgrep -f "mlx_nursery serve" | head -1)
( sleep 10; timeout 40 /tmp/spy/bin/py-spy record -p $SP -d 12 -r 50 --native --idle --threads -f raw -o /tmp/g/spy-one.txt > /dev/null 2>&1 ) &
SPYP=$!
timeout 90 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 1 \
  --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 30 --warmup 2 \
  --out /tmp/g/one.json > /tmp/g/one.log 2>&1
echo "== one (profiled): rc=$? $(elapsed)" >> $S; grep -E '^\| http|^GPU busy' /tmp/g/one.log >> $S
wait $SPYP
python3 docs/results/2026-11-29-gpu16/spy_summary.py /tmp/g/spy-one.txt Worker.run > $OUT/spy-one-summary.txt 2>&1
head -1 $OUT/spy-one-summary.txt >> $S
pkill -INT -f "mlx_nursery serve"
cd /tmp/g && tar -czf $OUT/one.tgz one.json one.log spy-one.txt && cd - > /dev/null
cat $S
