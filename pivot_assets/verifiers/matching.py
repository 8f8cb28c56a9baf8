"""Maximum bipartite matching (Kuhn's augmenting paths): pairs parallel calls as an unordered multiset.

Edges are 0/1 (two calls are equivalent or not), so maximum cardinality is the optimal assignment; no scipy.
"""

from __future__ import annotations

from typing import Callable


def max_bipartite_matching(n_left: int, n_right: int, edge: Callable[[int, int], bool]) -> list[tuple[int, int]]:
    """Maximum matching between left 0..n_left-1 and right 0..n_right-1; returns sorted (left, right) pairs.

    `edge(i, j)` is called lazily and at most once per pair per augmenting search; callers cache it when
    it is expensive.
    """
    match_of_right: list[int | None] = [None] * n_right

    def augment(i: int, seen: set[int]) -> bool:
        for j in range(n_right):
            if j in seen or not edge(i, j):
                continue
            seen.add(j)
            if match_of_right[j] is None or augment(match_of_right[j], seen):
                match_of_right[j] = i
                return True
        return False

    for i in range(n_left):
        augment(i, set())
    return sorted((i, j) for j, i in enumerate(match_of_right) if i is not None)
