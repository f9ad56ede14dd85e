#!/usr/bin/env bash
# Device run 4, on the machine that ran k4.sh (the last 2 minutes of the session's device
# time; what ran, as one command line): the server's start with the warm-up that now runs a
# prompt long enough to split the decode attention's keys, then two greedy clients of
# 500-1,000-token prompts with no warm-up requests of the benchmark's own, so that the first
# requests after ready (a batch of two long rows: the two-kernel form) are measured.
source bench/device/prepare.sh >/dev/null 2>&1; S=$OUT/a-summary.txt; python3 -m mlx_nursery serve --model /tmp/l8b --port 8100 > $OUT/server.log 2>&1 & s=$(date +%s); for i in $(seq 1 400); do python3 -c "import urllib.request,sys;sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8100/health',timeout=2).status==200 else 1)" 2>/dev/null && break; sleep 0.25; done; echo "ready after $(( $(date +%s) - s )) s" >> $S; timeout 40 python3 -P bench/serving.py --url http://127.0.0.1:8100 --model /tmp/l8b --clients 2 --input-len 500:1000 --output-len 64 --mix greedy --ignore-eos --duration 12 --warmup 0 --out $OUT/two.json > $OUT/two.log 2>&1; echo "bench rc=$?" >> $S; grep -E '^\| http' $OUT/two.log | head -1 >> $S; grep -E "warm-up" $OUT/server.log | tail -4 >> $S; cat $S
