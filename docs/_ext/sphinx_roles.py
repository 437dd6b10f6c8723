"""A griffe extension for the API reference: the docstrings' Sphinx roles (``:class:`~a.B```,
``:meth:`x```, ...) become code, linked to the object's reference entry where there is one.

The docstrings name objects the Sphinx way; mkdocstrings renders Markdown, where a role would
show as its raw text. Each role becomes an optional cross-reference (mkdocs-autorefs'
``<autoref optional>``): a link when the target is documented on some page, plain code when it
is not (a private module, say), never a warning.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|mod|data|attr|exc|obj):`(~?)([\w.]+)(\(\))?`")
PUBLIC = "lance_prefetch"


def _identifier(target: str, obj: griffe.Object) -> str:
    """The reference entry ``target`` most likely means, seen from ``obj``'s docstring."""
    if target.startswith(PUBLIC + "."):
        return target
    package = obj.package
    if target.split(".")[0] in package.members:
        return f"{PUBLIC}.{target}"
    scope = obj if obj.is_class or obj.is_module else obj.parent
    while scope is not None:
        if target.split(".")[0] in scope.members:
            return f"{scope.path}.{target}"
        scope = scope.parent
    return target


def convert(text: str, obj: griffe.Object) -> str:
    """``text`` with each Sphinx role replaced by an optional cross-reference."""

    def replace(match: re.Match[str]) -> str:
        tilde, target, call = match.groups()
        shown = (target.rsplit(".", 1)[-1] if tilde else target) + (call or "")
        identifier = html.escape(_identifier(target, obj), quote=True)
        return f'<autoref identifier="{identifier}" optional><code>{html.escape(shown)}</code></autoref>'

    return ROLE.sub(replace, text)


class SphinxRoles(griffe.Extension):
    """Rewrites every docstring of the loaded package once its object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = convert(obj.docstring.value, obj)
