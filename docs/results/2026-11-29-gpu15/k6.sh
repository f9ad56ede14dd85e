#!/usr/bin/env bash
# Device run 2 of a fresh machine (part 1 staged, part 2 carried), issue 32: what a padded
# chunk's `finalize` costs over four rows with ~8,000-token cached prefixes, mlx-lm's roll
# against `moved_right` (finalize_ab.py beside this script).
set -u
source bench/device/prepare.sh
timeout 120 python3 docs/results/2026-11-29-gpu15/finalize_ab.py | tee $OUT/finalize_ab.json
echo "rc=$? $(elapsed)"
