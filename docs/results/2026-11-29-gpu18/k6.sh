#!/usr/bin/env bash
# Prepared for the next session, not run: h6.sh again, its profile attached 25 s after ready
# (h6's, at 10 s, caught the benchmark's warm-up requests compiling the decode attention's
# split form, which the warm-up now builds: docs/results/2026-11-29-gpu18/call-3/). On a
# machine that ran k2.sh or h5.sh (kernels built, the model made; carry .whl/part-2 and
# .whl/spy): where a lone served stream's step goes (issue 32's one client, >= 150 tok/s;
# 122.5 measured), py-spy --native --idle at 50 Hz for 12 s on the engine thread in its
# steady state; then MLX's kernel cache directory listed (which modules it keeps: custom
# kernels are compiled at every start).
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
( sleep 25; timeout 40 /tmp/spy/bin/py-spy record -p $SP -d 12 -r 50 --native --idle --threads -f raw -o /tmp/g/spy-one.txt > /dev/null 2>&1 ) &
SPYP=$!
timeout 110 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 1 \
  --input-len 500:1000 --output-len 128 --mix greedy --ignore-eos --duration 45 --warmup 2 \
  --out /tmp/g/one.json > /tmp/g/one.log 2>&1
echo "== one (profiled): rc=$? $(elapsed)" >> $S; grep -E '^\| http|^GPU busy' /tmp/g/one.log >> $S
wait $SPYP
python3 docs/results/2026-11-29-gpu16/spy_summary.py /tmp/g/spy-one.txt Worker.run > $OUT/spy-one-summary.txt 2>&1
head -1 $OUT/spy-one-summary.txt >> $S
pkill -INT -f "mlx_nursery serve"
cd /tmp/g && tar -czf $OUT/one.tgz one.json one.log spy-one.txt && cd - > /dev/null
ls -la ~/.cache/mlx-nursery/cuda-kernels/*/ 2>/dev/null | awk '{print $5, $9}' | sort -k2 > $OUT/ptx-cache-listing.txt
cat $S
