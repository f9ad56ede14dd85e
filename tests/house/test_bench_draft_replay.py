"""bench/draft_replay.py replays the engine's drafting control on a recorded greedy output:
its step count must be what the control and the output imply."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_draft_replay", ROOT / "bench" / "draft_replay.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # attrs looks its module up while building classes
    spec.loader.exec_module(module)
    return module


def test_a_copied_answer_is_drafted_where_verifies_are_cheap_and_not_where_dear() -> None:
    tool = _load_tool()
    text = list(range(10, 70))
    prompt, output = [1, 2, *text, 3], text * 3  # the answer copies the prompt, then repeats
    cheap = tool.replay(prompt, output, 8, tool.ModeledCosts(0.05, 0.01))
    assert cheap.drafted > 0 and cheap.steps < len(output) / 2  # most drafts kept
    # A step gives its kept drafts and one token more (the last step may end the output
    # among its kept drafts).
    assert 0 <= cheap.steps - (len(output) - cheap.accepted) <= 1
    dear = tool.replay(prompt, output, 8, tool.ModeledCosts(0.1, 0.7))  # a CPU's verifies
    assert dear.drafted < cheap.drafted and dear.seconds > cheap.seconds
    nothing = tool.replay([5, 6, 7], list(range(100, 160)), 8, tool.ModeledCosts(0.05, 0.01))
    assert nothing.drafted == 0 and nothing.steps == 60  # nothing recurs: plain steps alone
