"""Write the documentation site's benchmarks page (docs/benchmarks.md) from benchmarks/README.md.

The README is the one place today's tables are edited; the page is the same text with its links made
relative to docs/ (``../docs/guides/x.md`` -> ``guides/x.md``). tests/test_docs.py fails while the page is stale.

    python benchmarks/docs_page.py           # rewrite docs/benchmarks.md
    python benchmarks/docs_page.py --check   # exit 1 if it is stale
"""
from __future__ import annotations

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "benchmarks", "README.md")
PAGE = os.path.join(ROOT, "docs", "benchmarks.md")
HEADER = "<!-- Generated from benchmarks/README.md by `python benchmarks/docs_page.py`: edit that file, not this one. -->\n\n"
# Markdown link or image targets: ](target) up to the closing parenthesis.
LINK = re.compile(r"\]\(([^)\s]+)\)")


def render(readme: str) -> str:
    """The page's text for the README's text. Raises ``ValueError`` for a relative link the page could not
    resolve (only ``../docs/...``, anchors and absolute URLs have a place on both)."""

    def rewrite(match: re.Match) -> str:
        target = match.group(1)
        if target.startswith("../docs/"):
            return f"]({target[len('../docs/'):]})"
        if target.startswith(("#", "http://", "https://")):
            return match.group(0)
        raise ValueError(f"benchmarks/README.md links to {target!r}, which docs/benchmarks.md cannot resolve: link to a "
                         f"page under docs/ as ../docs/<page>.md, or use an absolute URL")

    return HEADER + LINK.sub(rewrite, readme)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only check that docs/benchmarks.md is up to date")
    args = parser.parse_args()
    with open(README, encoding="utf-8") as f:
        page = render(f.read())
    current = open(PAGE, encoding="utf-8").read() if os.path.exists(PAGE) else None
    if args.check:
        if current != page:
            print("docs/benchmarks.md is stale: run python benchmarks/docs_page.py", file=sys.stderr)
            return 1
        return 0
    if current != page:
        with open(PAGE, "w", encoding="utf-8") as f:
            f.write(page)
        print(f"wrote {os.path.relpath(PAGE, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
