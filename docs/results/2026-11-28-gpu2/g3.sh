#!/usr/bin/env bash
# Device run (one H100): issue 34's draft model (Llama-3.2-1B shapes drafting for 8B), 1 and 8 streams.
set -u
t0=$(date +%s)
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
S="python3 -P bench/speculative.py --model /tmp/l8b --draft-model /tmp/l1b --kv-cache-bytes 4000000000 --rounds 2 --tokens 128"
timeout 150 $S --streams 1 --variants off "draft (adaptive, 4)" "draft fixed 4" --out $OUT/spec-draft-1.json > $OUT/spec-draft-1.log 2>&1; echo "d1 rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/spec-draft-1.log
timeout 150 $S --streams 8 --variants off "draft (adaptive, 4)" "draft fixed 4" --out $OUT/spec-draft-8.json > $OUT/spec-draft-8.log 2>&1; echo "d8 rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/spec-draft-8.log
echo "total: $(( $(date +%s) - t0 )) s"
