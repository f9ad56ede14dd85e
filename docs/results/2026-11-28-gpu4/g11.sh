#!/usr/bin/env bash
# Device run (one GPU), issue 34, part 2 of 2 (after g10.sh on the same machine): one stream,
# the build before (a927a9b, copied to bench/results/old/src) and this one, drafts up to 4
# and up to 8, each against its own off engine.
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1
S="python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3"
V=(off "ngram (adaptive, 4)" "ngram (adaptive, 8)")
PYTHONPATH=$PWD/bench/results/old/src timeout 270 $S --streams 1 --tokens 160 --variants "${V[@]}" --out $OUT/old-1.json > $OUT/old-1.log 2>&1; echo "old 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/old-1.log
PYTHONPATH=$PWD/src timeout 270 $S --streams 1 --tokens 160 --variants "${V[@]}" --out $OUT/new-1.json > $OUT/new-1.log 2>&1; echo "new 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/new-1.log
