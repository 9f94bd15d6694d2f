"""mkdocs hooks of the documentation site (mkdocs.yml: ``hooks``).

jes's docstrings cross-reference in Sphinx's roles (``:func:`train```, ``:class:`~jes.TrainState```), which
mkdocstrings renders as Markdown: the role's name would show as text before the code (":func:train"). The
rendered pages keep the code and drop the role; a ``~`` target shows its last name, as Sphinx shows it.
"""
from __future__ import annotations

import re

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|data|attr|mod|exc|obj|const|term|ref):(?=<code>)")
_TILDE = re.compile(r"<code>~(?:\w+\.)*(\w+)</code>")


def strip_roles(html: str) -> str:
    """``:func:<code>x</code>`` -> ``<code>x</code>``; ``<code>~a.b.C</code>`` -> ``<code>C</code>``."""
    return _TILDE.sub(r"<code>\1</code>", _ROLE.sub("", html))


def on_page_content(html: str, **kwargs) -> str:
    return strip_roles(html)
