"""The documentation site's checks of names and links (mkdocs.yml loads this file twice: as
an mkdocs hook, ``hooks:``, and as a Griffe extension of mkdocstrings, ``extensions:``).

The pages and the docstrings are written to read on their own too (a repository's file
view, ``help()``), so they name the API in code spans and link to files of the repository.
On the site:

- **A name of the API is a cross-reference.** An inline code span that is a public name of
  trioq (`` `trioq.Config` ``, `` `trioq.enqueue(conn, ...)` ``, `` `trioq.pg.Pool` ``,
  `` `trioq.Queue.claim` ``), in a page or in a docstring, links to its entry in the API
  reference (docs/reference/). A name that no longer exists is an unresolved
  cross-reference, which mkdocs-autorefs warns of: ``mkdocs build --strict`` fails on a
  renamed or removed name that the docs still mention. Spans that only look like names
  are left alone: the SQL objects of trioq's schema (`` `trioq.jobs` ``, `` `trioq.now` ``),
  the loggers (`` `trioq.runtime` ``), span attributes (`` `trioq.job.id` ``), private
  modules (`` `trioq._queue` ``), placeholders (`` `trioq.X` ``), and code in fenced blocks,
  headings and links.
- **A link out of docs/ into the repository** (`` [tests/obs_app.py](../tests/obs_app.py) ``)
  becomes its text, as the site has no copy of the source; the file it points at must
  exist, or the build warns (and --strict fails) as for a broken link between pages.
- **A function bound to a `Queue` method** (``enqueue = on_default_queue(Queue.enqueue)``
  in trioq/_enqueue.py, ``enqueue = _on_app_connection(Queue.enqueue)`` in JobContext) gets
  that method's signature, less its first parameters, and its docstring: what the wrapper
  (``without_first``) gives it at run time, for ``help()``, is read from the source here.
- **An attribute's ``#:`` comment is its docstring** (``#: Fallback polling when ...`` above
  ``Config.poll_interval``), as Sphinx reads it, and an attrs field shows its default, not
  the ``attrs.field(...)`` call: ``lease: float = 30.0``.
- **A name re-exported as** ``from ._config import Config as Config`` **is public**, as it
  is to mypy and to tests/test_public_api.py. Griffe takes an imported name for private
  unless ``__all__`` lists it, and trioq has no ``__all__``: without this the reference of
  ``trioq``, ``trioq.pg``, ``trioq.retry`` and ``trioq.testing`` would be empty.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import griffe

log = logging.getLogger("mkdocs.hooks.names")

#: First parts of ``trioq.<part>`` spans that are not Python names: tables and functions of
#: the SQL schema named trioq, the loggers, the OpenTelemetry span attributes, the examples.
NOT_PYTHON = frozenset({"now", "jobs", "sequences", "runtime", "cron", "hooks", "stress", "job",
                        "examples"})

FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
#: A link ([text](target), [text][ref]) or an inline code span (`x` or ``x``), whichever
#: starts first: a code span inside a link's text is left as it is.
TOKEN = re.compile(
    r"(?P<link>\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\](?:\((?P<url>[^)\s]*)[^)]*\)|\[[^\]]*\]))"
    r"|(?<!`)(?P<ticks>``?)(?P<code>[^`\n]+)(?P=ticks)(?!`)"
)
NAME = re.compile(r"trioq(?:\.[A-Za-z]\w*)+")


def api_name(code: str) -> str | None:
    """The identifier that a code span names (``trioq.enqueue(conn, ...)``: ``trioq.enqueue``),
    or None when it is not a public Python name of trioq."""
    found = NAME.match(code)
    rest = "" if found is None else code[found.end() :]
    if found is None or (rest and not rest.startswith("(")):
        return None
    name = found.group(0)
    parts = name.split(".")
    if parts[1] in NOT_PYTHON or any(re.fullmatch("[A-Z]", part) for part in parts):
        return None  # not Python, or a placeholder: ``trioq.X`` for any public name
    return name


def rewrite(text: str, link: Callable[[re.Match[str]], str]) -> str:
    """``text`` with each code span that names the API made a cross-reference, and each link
    handed to ``link``; fenced blocks and headings as they are."""

    def replace(match: re.Match[str]) -> str:
        if match["link"] is not None:
            return link(match)
        name = api_name(match["code"])
        return match.group(0) if name is None else f"[`{match['code']}`][{name}]"

    out: list[str] = []
    fence: str | None = None
    for line in text.split("\n"):
        opened = FENCE.match(line)
        if fence is not None:
            if opened is not None and opened.group(1).startswith(fence):
                fence = None
        elif opened is not None:
            fence = opened.group(1)
        elif not line.lstrip().startswith("#"):
            out.append(TOKEN.sub(replace, line))
            continue
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """The mkdocs hook: a page's names and its links into the repository."""
    docs = Path(config["docs_dir"]).resolve()
    page_dir = (docs / page.file.src_uri).parent

    def link(match: re.Match[str]) -> str:
        url = match["url"]
        if url is None or not url.startswith(".."):
            return match.group(0)
        target = (page_dir / url.split("#", 1)[0]).resolve()
        if target.is_relative_to(docs):  # a page: mkdocs checks it
            return match.group(0)
        if not target.is_relative_to(docs.parent) or not target.exists():
            log.warning("%s: a link to %r, which is no file of the repository",
                        page.file.src_uri, url)  # fmt: skip
        return match["text"]

    return rewrite(markdown, link)


#: The wrappers that give a function a `Queue` method's signature and docstring
#: (trioq._enqueue.without_first): the parameter that takes the place of ``conn`` (None:
#: ``conn`` stays), after ``self`` is dropped.
BOUND: dict[str, str | None] = {"on_default_queue": None, "_on_app_connection": "self"}


def bind(attr: griffe.Object, collection: Any) -> griffe.Function | None:
    """The function that ``attr`` (``name = wrapper(Queue.method)``) is, or None."""
    value = getattr(attr, "value", None)
    if not (isinstance(value, griffe.ExprCall) and str(value.function) in BOUND):
        return None
    (method_expr,) = value.arguments
    assert isinstance(method_expr, griffe.ExprAttribute), attr.path
    method = collection[method_expr.canonical_path]
    assert isinstance(method, griffe.Function), attr.path
    parameters = list(method.parameters)[1:]
    first = BOUND[str(value.function)]
    if first is not None:
        parameters[0] = griffe.Parameter(first, kind=griffe.ParameterKind.positional_only)
    docstring = method.docstring
    function = griffe.Function(
        attr.name,
        lineno=attr.lineno,
        endlineno=attr.endlineno,
        parameters=griffe.Parameters(*parameters),
        returns=method.returns,
        docstring=None if docstring is None else griffe.Docstring(
            docstring.value, lineno=docstring.lineno, endlineno=docstring.endlineno
        ),
    )  # fmt: skip
    function.labels = set(method.labels)
    return function


FIELDS = frozenset({"attrs.field", "attr.ib", "attr.field"})


def comment_docstring(attr: griffe.Attribute) -> griffe.Docstring | None:
    """The ``#:`` comment lines just above ``attr``, as its docstring."""
    if attr.lineno is None:
        return None
    lines = attr.module.lines
    above = attr.lineno - 2
    found: list[str] = []
    while above >= 0 and lines[above].lstrip().startswith("#:"):
        found.insert(0, lines[above].lstrip().removeprefix("#:").removeprefix(" "))
        above -= 1
    if not found:
        return None
    text = "\n".join(found)
    return griffe.Docstring(text, lineno=above + 2, endlineno=attr.lineno - 1, parent=attr)


def field_default(value: str | griffe.Expr | None) -> str | griffe.Expr | None:
    """The value to show for an attribute: an ``attrs.field(...)`` call's default
    (``factory=dict``: ``dict()``; none: None), any other value as it is."""
    if not (isinstance(value, griffe.ExprCall) and str(value.function) in FIELDS):
        return value
    for argument in value.arguments:
        if isinstance(argument, griffe.ExprKeyword) and argument.name == "default":
            return argument.value
        if isinstance(argument, griffe.ExprKeyword) and argument.name == "factory":
            return f"{argument.value}()"
    return None


def _objects(obj: griffe.Object) -> Iterator[griffe.Object]:
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            assert isinstance(member, griffe.Object)
            yield from _objects(member)


class TrioqNames(griffe.Extension):
    """The Griffe extension: public re-exports, and the docstrings' names."""

    def on_alias_instance(self, *, node: Any, alias: griffe.Alias, **kwargs: Any) -> None:
        if isinstance(node, ast.ImportFrom) and any(
            name.asname == name.name == alias.name for name in node.names
        ):
            alias.public = True

    def on_package(self, *, pkg: griffe.Module, loader: Any, **kwargs: Any) -> None:
        if pkg.name != "trioq":
            return
        for obj in list(_objects(pkg)):
            function = bind(obj, loader.modules_collection) if obj.is_attribute else None
            if function is not None and obj.parent is not None:
                obj.parent.set_member(obj.name, function)
        for obj in _objects(pkg):
            if isinstance(obj, griffe.Attribute):
                if obj.docstring is None:
                    obj.docstring = comment_docstring(obj)
                obj.value = field_default(obj.value)
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj.docstring.value, lambda match: match.group(0))
