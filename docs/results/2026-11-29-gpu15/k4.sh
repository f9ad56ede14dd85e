#!/usr/bin/env bash
# Device run (parts 1-3 staged in /tmp/stage, part 4 carried), issue 34: one stream of the real
# SmolLM2, prompt lookup (up to 8 drafts, the default), this tree (2256f58's control: a pause
# yields to a recurring context, lone stream) against df9346e's src (before it; base-src.tar,
# carried and not kept), each in a process of its own with its own `off` engines.
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
cp .whl/part-4/* /tmp/stage/ 2>/dev/null
smollm2 >> $S
mkdir -p /tmp/base && tar -xf docs/results/2026-11-29-gpu15/base-src.tar -C /tmp/base
V=(off "ngram (adaptive, 8)" "off (second engine)")
spec() {  # spec NAME SRC STREAMS TOKENS LIMIT
  PYTHONPATH=$2 timeout $5 python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3 \
    --streams $3 --tokens $4 --variants "${V[@]}" --out $OUT/$1.json > /tmp/$1.log 2>&1
  echo "$1: rc=$? $(elapsed)" >> $S
  grep -E "tok/s|x[0-9]\.[0-9]{2}" /tmp/$1.log | tail -10 | sed "s/^/  /" >> $S
}
spec new1 $PWD/src 1 400 220
spec old1 /tmp/base/src 1 400 220
cat $S
