"""The prefix cache's index of stored token sequences: a radix trie, one per namespace.

Why not mlx-lm's `PromptTrie` (which this replaced): it keeps one dict per token, so every
lookup, insert and removal walks the whole sequence in Python, a step per token, on the
engine thread, with every stream waiting. Agents resend prompts of tens of thousands of
tokens every turn; at 8,000 tokens a request's lookup and insert took milliseconds of the
engine thread on the development machine. Here an edge holds a run of tokens, compared with
the prompt's by list comparison (in C), so a walk takes a Python step per branching point:
about one per stored sequence sharing the path, not one per token.

`search` answers as mlx-lm's `PromptTrie.search` does (exact, shorter, the shared prefix),
except `longer`: any stored sequence past the shared prefix, not the shortest (any serves
the same reuse: its KV is trimmed back to that prefix). A test holds it to mlx-lm's.
Engine thread only; not thread-safe.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import attrs

V = TypeVar("V")


@attrs.frozen
class TrieMatch(Generic[V]):
    """What a prompt shares with the stored sequences (mlx-lm's `PromptTrieResult`'s
    fields): `exact` the prompt itself if stored; `shorter` the longest stored prefix of
    it (of two tokens or more, as mlx-lm's); `longer` a stored sequence that goes on past
    `common_prefix`, the prompt's longest prefix that any stored sequence shares. Each
    with the value it was stored with."""

    exact: list[int] | None
    shorter: list[int] | None
    longer: list[int] | None
    common_prefix: int
    exact_value: V | None = None
    shorter_value: V | None = None
    longer_value: V | None = None


class _Node(Generic[V]):
    """A point where a stored sequence ends or stored sequences part. `edges` maps an
    edge's first token to the edge: its tokens (at least one) and the node it leads to."""

    __slots__ = ("edges", "has_value", "value")

    def __init__(self) -> None:
        self.edges: dict[int, tuple[list[int], _Node[V]]] = {}
        self.has_value = False
        self.value: V | None = None


def _shared(label: list[int], tokens: list[int], start: int) -> int:
    """How many of `label`'s tokens `tokens[start:]` begins with: a binary search over
    slice comparisons, so the Python steps grow with the log of the length."""
    most = min(len(label), len(tokens) - start)
    if tokens[start : start + most] == label[:most]:
        return most
    low, high = 0, most - 1  # the answer is below `most`
    while low < high:
        middle = (low + high + 1) // 2
        if tokens[start : start + middle] == label[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


class PrefixTrie(Generic[V]):
    """Stored token sequences per namespace, each with a value."""

    def __init__(self) -> None:
        self._roots: dict[Hashable, _Node[V]] = {}

    def add(self, namespace: Hashable, tokens: list[int], value: V) -> V | None:
        """Store `tokens` with `value`; return the value it replaced (None if none)."""
        node = self._roots.setdefault(namespace, _Node())
        at = 0
        while at < len(tokens):
            edge = node.edges.get(tokens[at])
            if edge is None:
                leaf: _Node[V] = _Node()
                node.edges[tokens[at]] = (tokens[at:], leaf)
                node = leaf
                break
            label, child = edge
            shared = _shared(label, tokens, at)
            if shared == 0:  # an edge starts with its key: never, unless the trie is broken
                raise RuntimeError("a prefix trie edge does not start with its key")
            if shared < len(label):  # the sequence leaves this edge inside it: split it
                middle: _Node[V] = _Node()
                middle.edges[label[shared]] = (label[shared:], child)
                node.edges[tokens[at]] = (label[:shared], middle)
                child = middle
            node = child
            at += shared
        previous = node.value if node.has_value else None
        node.has_value, node.value = True, value
        return previous

    def pop(self, namespace: Hashable, tokens: list[int]) -> V | None:
        """Remove `tokens` (stored: KeyError otherwise); return its value."""
        path = self._path(namespace, tokens)
        node = path[-1][1]
        if not node.has_value:
            raise KeyError("not stored")
        value = node.value
        node.has_value, node.value = False, None
        self._prune(path)
        return value

    def pop_prefixes(self, namespace: Hashable, tokens: list[int]) -> list[tuple[int, V]]:
        """Remove every stored sequence that is a proper prefix of `tokens` (whose whole
        path must be stored); return each one's length and value."""
        popped: list[tuple[int, V]] = []
        path = self._path(namespace, tokens)
        for depth, node in path[:-1]:
            if node.has_value:
                popped.append((depth, node.value))  # type: ignore[arg-type]
                node.has_value, node.value = False, None
        # Each node left without a value on the path now has the one edge onward: merged
        # into its parent's, deepest first, so that an agent's growing conversation (each
        # turn's prompt extending the last) stays one edge, not a node per turn.
        for index in range(len(path) - 2, 0, -1):
            node, parent = path[index][1], path[index - 1][1]
            if not node.has_value and len(node.edges) == 1:
                self._merge(parent, self._edge_key(parent, node))
        return popped

    def search(self, namespace: Hashable, tokens: list[int]) -> TrieMatch[V]:
        node = self._roots.get(namespace)
        if node is None:
            return TrieMatch(None, None, None, 0)
        if not tokens and node.has_value:
            return TrieMatch([], None, None, 0, exact_value=node.value)
        at = 0
        shorter: tuple[int, V | None] | None = None
        below: tuple[list[int], _Node[V]] | None = None  # the rest of an edge left inside
        while at < len(tokens):
            edge = node.edges.get(tokens[at])
            if edge is None:
                break
            label, child = edge
            shared = _shared(label, tokens, at)
            at += shared
            if shared < len(label):
                below = (label[shared:], child)
                break
            node = child
            if node.has_value:
                shorter = (at, node.value)
        if shorter is not None and shorter[0] == len(tokens):
            return TrieMatch(tokens, None, None, 0, exact_value=shorter[1])
        found_shorter = shorter if shorter is not None and shorter[0] > 1 else None
        longer: list[int] | None = None
        longer_value = None
        if at > 0:
            longer = tokens[:at]
            if below is not None:
                longer += below[0]
                node = below[1]
            while not node.has_value:  # every leaf holds a value (`_prune` sees to it)
                label, node = next(iter(node.edges.values()))
                longer += label
            longer_value = node.value
        return TrieMatch(
            None,
            tokens[: found_shorter[0]] if found_shorter is not None else None,
            longer,
            at,
            shorter_value=found_shorter[1] if found_shorter is not None else None,
            longer_value=longer_value,
        )

    def _path(self, namespace: Hashable, tokens: list[int]) -> list[tuple[int, _Node[V]]]:
        """The nodes `tokens` passes through, with their depths, the root first and the
        node where `tokens` ends last (KeyError if it does not end at one)."""
        node = self._roots[namespace]
        path = [(0, node)]
        at = 0
        while at < len(tokens):
            label, node = node.edges[tokens[at]]
            if tokens[at : at + len(label)] != label:
                raise KeyError("not stored")
            at += len(label)
            path.append((at, node))
        return path

    def _prune(self, path: list[tuple[int, _Node[V]]]) -> None:
        """After a removal at `path`'s end: drop nodes left with neither a value nor an
        edge, and merge a valueless node with one edge into its parent's edge."""
        for index in range(len(path) - 1, 0, -1):
            node = path[index][1]
            parent = path[index - 1][1]
            key = self._edge_key(parent, node)
            if not node.has_value and not node.edges:
                del parent.edges[key]
                continue
            if not node.has_value and len(node.edges) == 1:
                self._merge(parent, key)
            break

    @staticmethod
    def _merge(parent: _Node[V], key: int) -> None:
        """Join `parent`'s edge `key` with the one edge of the valueless node it leads to."""
        label, node = parent.edges[key]
        ((rest, child),) = node.edges.values()
        parent.edges[key] = (label + rest, child)

    @staticmethod
    def _edge_key(parent: _Node[V], child: _Node[V]) -> int:
        for key, (_, node) in parent.edges.items():
            if node is child:
                return key
        raise KeyError("not a child")
