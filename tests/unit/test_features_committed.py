"""The committed FEATURES.md and SUPPORTED_MODELS.md are exactly what the generator writes from the
committed records: a hand edit, a record committed without regenerating, or a table regenerated
from records that were not committed all fail here. Fix: `make features`, then commit the records
and both pages together."""

from __future__ import annotations

import difflib

import pytest

from harness.features import FEATURES_MD, SUPPORTED_MD, check_citations, generate, tracked_records
from harness.workspace import REPO_ROOT, Workspace


@pytest.fixture(scope="module")
def generated():  # noqa: ANN201
    ws = Workspace(REPO_ROOT)
    paths = tracked_records(ws)
    if paths is None:
        pytest.skip("not a git checkout: the committed records cannot be listed")
    return ws, generate(ws, paths=paths)


@pytest.mark.parametrize("name", [FEATURES_MD, SUPPORTED_MD])
def test_committed_page_is_the_generator_output(generated, name: str) -> None:  # noqa: ANN001
    ws, g = generated
    want = g.features if name == FEATURES_MD else g.supported
    have = (ws.root / name).read_text() if (ws.root / name).exists() else ""
    if have != want:
        diff = "".join(list(difflib.unified_diff(have.splitlines(True), want.splitlines(True),
                                                 f"{name} (committed)", f"{name} (generated)"))[:40])
        pytest.fail(f"{name} differs from what `make features` writes from the committed records:\n"
                    f"{diff}", pytrace=False)


def test_committed_pages_cite_only_committed_records(generated) -> None:  # noqa: ANN001
    ws, g = generated
    tracked = {p.relative_to(ws.root).as_posix() for p in tracked_records(ws) or []}
    assert set(g.table.cited) <= tracked
    assert check_citations(ws, g.features, g.supported) == []
