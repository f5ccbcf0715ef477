"""The documentation hangs together: the index names every page, every relative link (and its #anchor)
resolves, and the generated field reference matches the models."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
GENERATOR = ROOT / "hack" / "gen-field-reference.py"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p != DOCS / "README.md")


def _links(page: Path) -> list[str]:
    # Code spans and fenced blocks hold examples, not links.
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return LINK.findall(re.sub(r"`[^`\n]*`", "", text))


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_index_links_every_page() -> None:
    linked = {(DOCS / target.split("#")[0]).resolve() for target in _links(DOCS / "README.md")}
    missing = [str(p.relative_to(DOCS)) for p in _pages() if p.resolve() not in linked]
    assert not missing, f"docs/README.md does not link {missing}"


@pytest.mark.parametrize(
    "page", [ROOT / "README.md", DOCS / "README.md", *_pages()], ids=lambda p: str(p.relative_to(ROOT))
)
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target} (no such heading)")
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


def test_field_reference_is_generated_from_the_current_models(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR), "--out", str(tmp_path)], check=True, capture_output=True)
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.md")}
    assert set(fresh) == {"app.md", "trialgroup.md", "modeldeployment.md", "queue.md"}
    for name, text in fresh.items():
        committed = DOCS / "reference" / name
        assert committed.exists() and committed.read_text() == text, (
            f"docs/reference/{name} is stale: run .venv/bin/python hack/gen-field-reference.py"
        )


def test_check_mode_reports_a_stale_page(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(GENERATOR), "--out", str(tmp_path)], check=True, capture_output=True)
    (tmp_path / "app.md").write_text("out of date\n")
    run = subprocess.run(
        [sys.executable, str(GENERATOR), "--out", str(tmp_path), "--check"], capture_output=True, text=True
    )
    assert run.returncode == 1 and "stale" in run.stdout and "app.md" in run.stdout
    assert (tmp_path / "app.md").read_text() == "out of date\n"  # --check writes nothing


def test_reference_lists_every_spec_field_of_the_models() -> None:
    from tessera.api.resources import KINDS

    for kind in KINDS.values():
        text = (DOCS / "reference" / f"{kind.kind.lower()}.md").read_text()
        for field in kind.spec_model.model_fields.values():
            assert f"| `{field.alias}` |" in text, f"{kind.kind}: spec.{field.alias} missing"
