"""Summarize a py-spy raw (collapsed, --threads --native) file for the engine thread:
inclusive shares by frame, over all its samples and over those inside MLX's async_eval, and
the leaf frames (self time). Usage: spy_summary.py RAW [MARKER]"""

from __future__ import annotations

import re
import sys
from collections import Counter

FRAME = re.compile(r"^(.*?) \((?:[^()]*)\)$")


def name(frame: str) -> str:
    m = FRAME.match(frame.strip())
    return m.group(1) if m else frame.strip()


def main() -> None:
    path = sys.argv[1]
    marker = sys.argv[2] if len(sys.argv) > 2 else "Worker.run"
    stacks: list[tuple[list[str], int]] = []
    for line in open(path):
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        frames = [name(f) for f in stack.split(";")]
        if any(marker in f for f in frames):
            stacks.append((frames, int(count)))
    total = sum(n for _, n in stacks)
    print(f"samples {total} (marker {marker!r})")

    def inclusive(selected: list[tuple[list[str], int]], title: str, top: int) -> None:
        n_all = sum(n for _, n in selected) or 1
        counts: Counter[str] = Counter()
        for frames, n in selected:
            for f in set(frames):
                counts[f] += n
        print(f"--- {title}: {n_all} samples ({100 * n_all / max(total, 1):.1f}% of the thread)")
        for f, n in counts.most_common(top):
            if f.startswith("0x"):
                continue
            print(f"{100 * n / n_all:6.1f}% {f[:110]}")

    inclusive(stacks, "inclusive, the engine thread", 70)
    inside = [(f[f.index("mlx::core::async_eval"):], n) for f, n in stacks if "mlx::core::async_eval" in f]
    inclusive(inside, "inside async_eval", 70)
    leaves: Counter[str] = Counter()
    for frames, n in stacks:
        named = [f for f in frames if not f.startswith("0x")]
        leaves[named[-1] if named else frames[-1]] += n
    print("--- leaves (deepest named frame)")
    for f, n in leaves.most_common(40):
        print(f"{100 * n / max(total, 1):6.1f}% {f[:110]}")


if __name__ == "__main__":
    main()
