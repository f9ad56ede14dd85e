#!/usr/bin/env bash
# Device run (one GPU; part 1 staged in /tmp/stage, part 2 carried), issue 34: eight streams
# of the 8B-shaped model with and without adaptive prompt lookup, the engines' warm-up logged
# (which phases ran, which the budget skipped), to see whether round 1's slow verify steps on
# a machine's first start are kernels the warm-up did not build.
set -u
source bench/device/prepare.sh
model_8b
left=$(( 580 - $(date +%s) + PREPARE_T0 ))
timeout $left python3 -P bench/speculative.py --model /tmp/l8b --kv-cache-bytes 4000000000 \
  --rounds 2 --tokens 48 --streams 8 --variants off "ngram (adaptive, 4)" --trace-costs \
  --out $OUT/spec8-8b.json > $OUT/spec8-8b.log 2>&1
echo "spec: rc=$? $(elapsed)"
grep -E "warm-up|x[0-9]\.[0-9]{2}|drafts [0-9]:" $OUT/spec8-8b.log | tail -40
