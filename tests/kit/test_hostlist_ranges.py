"""Hostlist ranges that overlap, touch or repeat, against the plainest reading of them: each
name once, in the order it first appears; ``size`` counts the same names, and ``compress``
of them expands back to the same set. (Mutation testing found the merging of ranges under
tested: an off-by-one there names a node twice or drops one.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kit import hostlist

RANGES = st.lists(st.tuples(st.integers(0, 40), st.integers(0, 12)), min_size=1, max_size=8)


def plain(ranges: list[tuple[int, int]], width: int) -> list[str]:
    names: dict[str, None] = {}
    for low, span in ranges:
        for number in range(low, low + span + 1):
            names.setdefault(f"gpu{number:0{width}d}", None)
    return list(names)


def expression(ranges: list[tuple[int, int]], width: int) -> str:
    return "gpu[" + ",".join(f"{low:0{width}d}-{low + span:0{width}d}"
                             for low, span in ranges) + "]"


@settings(max_examples=300, deadline=None)
@given(RANGES, st.sampled_from([1, 2, 3]))
def test_overlapping_ranges_name_each_node_once_in_first_seen_order(
        ranges: list[tuple[int, int]], width: int) -> None:
    text = expression(ranges, width)
    names = plain(ranges, width)
    assert hostlist.expand(text) == names
    assert hostlist.size(text) == len(names)
    assert sorted(hostlist.expand(hostlist.compress(names))) == sorted(names)


def test_touching_and_contained_ranges() -> None:
    assert hostlist.expand("gpu[01-03,04-05]") == [f"gpu0{i}" for i in range(1, 6)]
    assert hostlist.expand("gpu[01-09,03-04,08-10]") == [f"gpu{i:02d}" for i in range(1, 11)]
    assert hostlist.expand("gpu[05-06,01-02,03-04]") == [
        "gpu05", "gpu06", "gpu01", "gpu02", "gpu03", "gpu04"]
    assert hostlist.size("gpu[01-04,02-03,01-04]") == 4


def test_a_padded_range_past_its_padding_meets_the_unpadded_names() -> None:
    """``00-10`` spells 10 as ``10``, as ``9-10`` does: 12 names (``09`` and ``9`` differ),
    counted so before any is made, so that exactly MAX_NAMES of them still expand."""
    assert hostlist.size("gpu[00-10,9-10]") == 12
    assert hostlist.expand("gpu[00-10,9-10]")[-2:] == ["gpu10", "gpu9"]
    at_the_limit = f"n[00-10,9-10],m[1-{hostlist.MAX_NAMES - 12}]"
    assert len(hostlist.expand(at_the_limit)) == hostlist.MAX_NAMES


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["gpu", "node", "a.b-"]), st.integers(0, 120),
                          st.sampled_from([1, 2, 3])), min_size=1, max_size=30))
def test_compress_gives_back_the_same_names(picked: list[tuple[str, int, int]]) -> None:
    names = list(dict.fromkeys(f"{prefix}{number:0{width}d}" for prefix, number, width in picked))
    assert sorted(hostlist.expand(hostlist.compress(names))) == sorted(names)
    assert hostlist.size(hostlist.compress(names)) == len(names)
