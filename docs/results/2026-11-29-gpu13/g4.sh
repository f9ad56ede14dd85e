#!/usr/bin/env bash
# Device run (the machine of g3.sh if still warm; else a fresh one after staging): where the
# warm ~8K-token shared prompt's TTFT goes (warm_prefix.py: the engine in-process, then the
# bare copy + forward + read); the piecewise encoder on an ~8K-token system prompt with the
# 8B-shaped model's tokenizer (bench/tokenizing.py).
set -u
source bench/device/prepare.sh
S=$OUT/summary.txt
model_8b >> $S
timeout 300 python3 -P docs/results/2026-11-29-gpu13/warm_prefix.py /tmp/l8b > /tmp/warm.log 2>&1
echo "warm_prefix: rc=$? $(elapsed)" >> $S
grep -E '^(engine|bare)' /tmp/warm.log >> $S; tail -3 /tmp/warm.log >> $S
timeout 120 python3 -P bench/tokenizing.py --tokenizer /tmp/l8b --shared-words 2750 --conversations 10 > /tmp/tok.log 2>&1
echo "tokenizing: rc=$? $(elapsed)" >> $S
tail -15 /tmp/tok.log >> $S
cat $S
