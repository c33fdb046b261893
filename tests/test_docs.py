"""The README is a guide and the definitions say what is true now (issue 35): every relative link of README and
docs/ resolves, README stays short and keeps its two commands, and the history of runs and commits lives only in
docs/results.md."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_MAX_BYTES = 12 * 1024
# the pages that define (what is measured, how, where the code is): no run history in them
DEFINITIONS = ("measurement.md", "schema.md", "cluster.md", "architecture.md")

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# a short commit id: 7-12 hex digits with a letter and a digit, not part of a run key (``...-r0-24558b320b``)
COMMIT = re.compile(r"(?<![-\w])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![-\w])")
# a run's label (X3, Y5, F10; looked for outside code spans, where `N1` is a symbol) or a session's stop
RUN = re.compile(r"(?<![\w.])[A-Z]\d{1,2}(?!\w)|\bstop \d+\b")
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2} (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)[a-z]* 20\d\d\b"
                  r"|\b\d{8}T\d{6}Z\b")


def _pages() -> list[str]:
    pages = [README, os.path.join(ROOT, "notebooks", "README.md")]
    pages += sorted(os.path.join(DOCS, f) for f in os.listdir(DOCS) if f.endswith(".md"))
    return pages


def _outside_code(text: str) -> str:
    """``text`` without its fenced code blocks (a link's syntax there is code, not a link)."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def broken_links(path: str) -> list[str]:
    """The relative links of the Markdown page ``path`` whose target does not exist."""
    out = []
    for target in LINK.findall(_outside_code(open(path).read())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the page itself
        file = target.split("#", 1)[0]
        if not os.path.exists(os.path.join(os.path.dirname(path), file)):
            out.append(target)
    return out


def test_broken_links_finds_a_missing_target(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[a](there.md) [b](there.md#part) [c](missing.md) ![d](img/none.png) [e](https://x.org/y)\n"
                    "```\n[f](not-a-link.md)\n```\n")
    assert broken_links(str(page)) == ["missing.md", "img/none.png"]


def test_every_relative_link_of_readme_and_docs_resolves():
    broken = {os.path.relpath(p, ROOT): b for p in _pages() if os.path.exists(p) and (b := broken_links(p))}
    assert not broken, f"links to files that do not exist: {broken}"


def test_readme_is_a_short_guide_with_its_two_commands_and_picture():
    raw = open(README, "rb").read()
    assert len(raw) <= README_MAX_BYTES, f"README.md is {len(raw)} bytes; at most {README_MAX_BYTES}"
    text = raw.decode()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    for command in ("make study", "make test"):
        assert re.search(rf"^{command}\b", blocks, flags=re.M), f"README's commands lack `{command}`"
    assert "docs/img/front_page.png" in text


def test_readme_outside_its_generated_block_and_the_definitions_carry_no_history():
    from kanlib import report

    text = open(README).read()
    i, j = text.index(report.README_START), text.index(report.README_END)
    pages = {"README.md (outside the generated block)": text[:i] + text[j:]}
    pages.update({f"docs/{f}": open(os.path.join(DOCS, f)).read() for f in DEFINITIONS})
    found = {}
    for name, page in pages.items():
        prose = re.sub(r"`[^`\n]*`", "", _outside_code(page))
        hits = COMMIT.findall(page) + [m.group(0) for m in (*DATE.finditer(page), *RUN.finditer(prose))]
        if hits:
            found[name] = hits
    assert not found, f"commit ids, dates or run names outside docs/results.md (history lives there): {found}"
