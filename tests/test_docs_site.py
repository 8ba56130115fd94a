"""The docs: the site builds with ``mkdocs build --strict``, and every relative link resolves.

The site is ``mkdocs.yml`` over ``docs/`` (mkdocs-material, the ``docs`` extra). In strict mode a
link to a missing page or anchor, or a page left out of the nav, fails the build. The README is
not part of the site, so its links, and the images and links of every page read as plain markdown
(as a code host shows them), are checked here on the files themselves.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

FENCE = re.compile(r"^ {0,8}(```|~~~).*?^ {0,8}\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?!`).*?(?<!`)\1(?!`)", re.DOTALL)
INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^)]*[\"'])?\s*\)")
REFERENCE_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.MULTILINE)
HTML_TARGET = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"']", re.IGNORECASE)
EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//|#)", re.IGNORECASE)  # http:, mailto:, //host, #anchor


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def link_targets(text: str) -> list[str]:
    """Every link and image target in markdown text, code blocks and code spans left out."""
    text = CODE_SPAN.sub("", FENCE.sub("", text))
    return [m.group(1) for pattern in (INLINE_LINK, REFERENCE_LINK, HTML_TARGET) for m in pattern.finditer(text)]


def broken_links(files: list[Path], root: Path) -> list[str]:
    """``FILE: TARGET`` for each relative target that names no existing file or directory."""
    broken = []
    for file in files:
        for target in link_targets(file.read_text(encoding="utf-8")):
            if EXTERNAL.match(target):
                continue
            path = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not path:
                continue
            resolved = root / path.lstrip("/") if path.startswith("/") else file.parent / path
            if not resolved.exists():
                broken.append(f"{file.relative_to(root)}: {target}")
    return broken


def mkdocs_build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=project, capture_output=True, text=True, timeout=300, env=env)


def nav_files(nav: list | dict | str) -> list[str]:
    """The page paths a ``nav`` entry lists, sections flattened."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, dict):
        return [f for value in nav.values() for f in nav_files(value)]
    return [f for entry in nav for f in nav_files(entry)]


def test_the_site_builds_strict_and_a_broken_link_would_fail_it(tmp_path: Path) -> None:
    # First the check itself: the repository's settings, over one page with a dead link, must fail.
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config.get("strict") is True and config["theme"]["name"] == "material"
    pages = {page.relative_to(DOCS).as_posix() for page in DOCS.rglob("*.md")}
    assert pages <= set(nav_files(config["nav"])), "a page under docs/ is missing from the nav"
    broken = tmp_path / "broken"
    (broken / "docs").mkdir(parents=True)
    (broken / "docs" / "index.md").write_text("# Home\n\nSee [the missing page](missing.md).\n", encoding="utf-8")
    config.update(docs_dir="docs", nav=[{"Home": "index.md"}])
    (broken / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    failed = mkdocs_build(broken, tmp_path / "broken-site")
    assert failed.returncode != 0, f"a dead link did not fail the strict build:\n{failed.stderr[-3000:]}"
    assert "missing.md" in failed.stderr

    # Then the real site.
    done = mkdocs_build(ROOT, tmp_path / "site")
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_every_relative_link_and_image_in_the_readme_and_docs_exists(tmp_path: Path) -> None:
    # First the checker, on a file with known good and bad targets.
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n", encoding="utf-8")
    (tmp_path / "docs" / "plot.png").write_bytes(b"\x89PNG")
    sample = tmp_path / "README.md"
    sample.write_text(
        "[ok](docs/there.md) [ok too](docs/there.md#a-heading) ![plot](docs/plot.png)\n"
        "[web](https://example.org/nowhere.md) [anchor](#intro) [mail](mailto:someone@example.org)\n"
        "[gone](docs/gone.md) ![lost](docs/lost.png) <img src=\"docs/missing.svg\" alt=\"x\">\n"
        "[ref]: docs/no-such-dir/\n"
        "`[in code](docs/not-a-link.md)`\n\n```\n[in a block](docs/not-a-link-either.md)\n```\n",
        encoding="utf-8")
    assert broken_links([sample], tmp_path) == [
        "README.md: docs/gone.md", "README.md: docs/lost.png", "README.md: docs/no-such-dir/",
        "README.md: docs/missing.svg"]

    # Then the real files.
    files = markdown_files()
    assert len(files) > 10 and (DOCS / "reference" / "cli.md") in files
    assert sum(len(link_targets(f.read_text(encoding="utf-8"))) for f in files) > 50
    broken = broken_links(files, ROOT)
    assert not broken, "links to files that do not exist:\n" + "\n".join(broken)


def test_the_readme_stays_short_and_keeps_the_two_commands_near_the_top() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    top = "\n".join(lines[:40])
    assert "make demo" in top and "make test" in top
