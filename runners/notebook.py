"""What the study notebooks call, so they stay thin: parameter checking and the notebook files themselves (a launch
notebook's RunConfig fields go to its plan as mappings: runners.plans.settings).

The notebooks' source of truth is ``notebooks/*.py`` in jupytext's percent format (reviewable text;
JupyterLab opens and edits them with jupytext, and they never hold outputs). papermill and nbval run
``.ipynb`` files, which :func:`to_ipynb` generates from the ``.py`` into the ignored ``build/notebooks/``
(``make notebooks``); executed notebooks go to ``outputs/notebooks/``, and :func:`export_html` turns
one into an HTML page that opens offline (no require.js, MathJax, mermaid or widget manager from a CDN).

:func:`check_parameters` is the first call after a notebook's parameters cell. papermill injects
``-p`` values as they come (``-p world_sizes 2`` is the int 2, ``-p widths 2,16,1`` the string
``"2,16,1"``) and only warns about a name the notebook does not have; this function coerces each
parameter to the type its annotation declares (scalars by the rule of kanlib.config, the one of every config
field), or raises :class:`ParameterError` naming it, and refuses an injected name the notebook does not declare.

Command line (the Makefile's): ``python -m runners.notebook ipynb [NAME ...]`` writes the ``.ipynb`` of
each notebook (all by default) under ``build/notebooks/``; ``python -m runners.notebook html IN OUT``
exports an executed notebook to offline HTML.
"""

from __future__ import annotations

import ast
import difflib
import json
import os
import sys
import typing

from kanlib import config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK_DIR = os.path.join(REPO, "notebooks")
BUILD_DIR = os.path.join(REPO, "build", "notebooks")
TEMPLATE_DIR = os.path.join(NOTEBOOK_DIR, "nbconvert")
# ipykernel's own spec: JupyterLab writes the running kernel's spec into a notebook it saves, so the sources
# carry exactly this one, and saving a notebook in JupyterLab leaves its text unchanged
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


class ParameterError(ValueError):
    """A notebook parameter has a value of the wrong type, or is not a parameter of the notebook."""


# -- parameters ------------------------------------------------------------------------------
def check_parameters(ns: dict) -> dict:
    """Coerce every parameter of the notebook whose namespace is ``ns`` (``globals()``) to its
    annotated type, in place, and return them as a dict.

    The parameters are the annotated names of the parameters cell (``ns['__annotations__']``). A name
    that papermill injected (the latest executed cell starting ``# Parameters``, from
    ``ns['In']``) but the notebook does not declare is an error naming it and the closest parameter.
    Coercions: a scalar becomes a one-element list (``-p world_sizes 2`` -> ``[2]``); a string becomes
    a list by ``[...]`` literal or by commas (``"2,16,1"`` -> ``[2, 16, 1]``, ``"[1,3]"`` -> ``[1, 3]``);
    ``"true"``/``"false"`` become booleans; numeric strings become numbers; a dict may be given as a
    literal string. Anything else raises :class:`ParameterError` naming the parameter.
    """
    declared = dict(ns.get("__annotations__") or {})
    if not declared:
        raise ParameterError("the notebook declares no parameters (annotated names in its parameters cell)")
    unknown = [n for n in injected_names(ns) if n not in declared]
    if unknown:
        hints = []
        for n in unknown:
            close = difflib.get_close_matches(n, list(declared), n=1)
            hints.append(f"{n!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ParameterError(f"parameter {', '.join(hints)}: not a parameter of this notebook; its parameters: "
                             f"{', '.join(declared)}")
    out = {}
    for name, hint in declared.items():
        if name not in ns:
            raise ParameterError(f"parameter {name!r}: declared without a value")
        ns[name] = out[name] = coerce(name, ns[name], hint)
    return out


def injected_names(ns: dict) -> list[str]:
    """The names assigned by papermill's injected cell (``# Parameters`` first), if one ran in this kernel."""
    for src in reversed(list(ns.get("In") or [])):
        if isinstance(src, str) and src.lstrip().startswith("# Parameters"):
            try:
                tree = ast.parse(src)
            except SyntaxError:
                return []
            return [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
                    if isinstance(t, ast.Name)]
    return []


def _describe(hint, plural: bool = False) -> str:
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return ("lists of " if plural else "a list of ") + (_describe(args[0], True) if args else "values")
    if plural:
        return {int: "integers", float: "numbers", bool: "booleans", str: "strings", dict: "mappings"}.get(hint, "values")
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string",
            dict: "a mapping"}.get(hint, getattr(hint, "__name__", str(hint)))


def _example(hint) -> str:
    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return "'[1, 2]'"
    return {int: "2", float: "0.5", bool: "true", str: "kan", dict: "'{\"partition\": \"gpu\"}'"}.get(hint, "...")


def coerce(name: str, v, hint):
    """``v`` as the type ``hint`` (a parameter annotation) declares, or :class:`ParameterError`.

    A scalar follows kanlib.config's rule for config fields (:func:`kanlib.config.coerce`, a string read as the
    command line reads it, :func:`kanlib.config.parse_text`), after what papermill gives besides: ``-p flag 1``
    (an int) for a boolean, ``-p target 3`` (a number) for a string. Lists and mappings are this module's: a
    scalar or a comma-separated or ``[...]`` string becomes a list, a literal string a mapping."""
    def fail(why: str = ""):
        raise ParameterError(f"parameter {name}: expected {_describe(hint)}, got {v!r} ({type(v).__name__})"
                             + (f": {why}" if why else "") + f"; e.g. papermill -p {name} {_example(hint)}")

    origin = typing.get_origin(hint)
    if origin in (list, tuple):
        return _coerce_list(name, v, hint, fail)
    if hint is dict or origin is dict:
        return _coerce_dict(v, fail)
    if hint not in (int, float, bool, str):
        return v  # an annotation this module does not coerce (left as given)
    value = v
    if hint is bool and isinstance(v, int) and not isinstance(v, bool) and v in (0, 1):
        value = bool(v)
    elif hint is str and isinstance(v, (int, float)) and not isinstance(v, bool):
        value = str(v)  # papermill reads `-p target 3` as a number
    elif hint is not str and isinstance(v, str):
        try:
            value = config.parse_text(name, v.strip(), hint)
        except config.ConfigError:
            fail()
    try:
        return config.coerce(name, value, hint)
    except config.ConfigError as e:
        why = str(e).split(": ", 1)[1]
        fail("" if why.startswith(("expected", "must be true or false")) else why.split(", got")[0])


def _coerce_list(name: str, v, hint, fail) -> list:
    (elem,) = typing.get_args(hint) or (typing.Any,)
    items = v
    if isinstance(v, str):
        text = v.strip()
        if text.startswith("["):
            try:
                items = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                fail("not a list literal")
        else:
            items = [p.strip() for p in text.split(",") if p.strip()]
    elif not isinstance(v, (list, tuple)):
        items = [v]
    if not isinstance(items, (list, tuple)):
        fail()
    try:
        return [coerce(name, x, elem) if elem is not typing.Any else x for x in items]
    except ParameterError as e:
        raise ParameterError(f"{e} (in {v!r})") from None


def _coerce_dict(v, fail) -> dict:
    if isinstance(v, dict):
        return v
    if isinstance(v, str):
        try:
            d = ast.literal_eval(v.strip()) if v.strip() else {}
        except (ValueError, SyntaxError):
            try:
                d = json.loads(v)
            except ValueError:
                fail("not a mapping literal")
        if isinstance(d, dict):
            return d
    fail()


# -- notebook files --------------------------------------------------------------------------
def sources() -> list[str]:
    """The notebooks' ``.py`` sources, in run order (launch notebooks, analyses, then guidelines): the registry's
    (:func:`kanlib.studies.run_order`)."""
    from kanlib import studies

    return [os.path.join(NOTEBOOK_DIR, name + ".py") for name, _ in studies.run_order()]


def _source(name: str) -> str:
    path = name if name.endswith(".py") and os.path.exists(name) else os.path.join(NOTEBOOK_DIR, name.removesuffix(
        ".ipynb").removesuffix(".py") + ".py")
    if not os.path.exists(path):
        raise FileNotFoundError(f"notebook {name!r}: no {path} (have: "
                                f"{', '.join(os.path.basename(p) for p in sources())})")
    return path


def to_ipynb(name: str, out_dir: str = BUILD_DIR) -> str:
    """Write ``out_dir/<name>.ipynb`` from ``notebooks/<name>.py`` (outputs empty, python3 kernel) and
    return its path. Rewritten only when its content changes, so a run does not touch it."""
    import jupytext
    import nbformat

    src = _source(name)
    nb = jupytext.read(src)
    nb.metadata["kernelspec"] = dict(KERNEL)
    nb.metadata.setdefault("language_info", {"name": "python"})
    nb.metadata.pop("jupytext", None)  # the .ipynb is generated, not paired
    for i, cell in enumerate(nb.cells):  # stable ids (jupytext draws random ones), so equal text means equal file
        cell.id = f"cell-{i}"
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, os.path.basename(src)[:-3] + ".ipynb")
    text = nbformat.writes(nb)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    return path


def notebook_title(nb, path: str) -> str:
    """The page title of an exported notebook: its first Markdown heading, else its file name (nbconvert's default
    is "Notebook" for every page)."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return os.path.splitext(os.path.basename(path))[0]


def export_html(ipynb: str, html_path: str | None = None) -> str:
    """Export an executed notebook to HTML that opens offline (template ``notebooks/nbconvert/offline``:
    JupyterLab's, without its CDN scripts; figures draw from the plotly.js the notebook embeds)."""
    import nbformat
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[TEMPLATE_DIR])
    nb = nbformat.read(ipynb, as_version=4)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": notebook_title(nb, ipynb)}})
    html_path = html_path or ipynb[: -len(".ipynb")] + ".html"
    with open(html_path, "w") as f:
        f.write(body)
    return html_path


def main(argv: list[str]) -> int:
    if argv[:1] == ["ipynb"]:
        out, names = BUILD_DIR, argv[1:]
        if names[:1] == ["--out"]:
            out, names = names[1], names[2:]
        for src in ([_source(n) for n in names] or sources()):
            print(to_ipynb(src, out))
        return 0
    if argv[:1] == ["html"] and len(argv) == 3 and argv[2].endswith(".html"):
        print(export_html(argv[1], argv[2]))
        return 0
    if argv[:1] == ["html"] and len(argv) > 1 and all(a.endswith(".ipynb") for a in argv[1:]):
        for ipynb in argv[1:]:  # one process for all: nbconvert's import is most of an export's time
            print(export_html(ipynb))
        return 0
    print("usage: python -m runners.notebook ipynb [--out DIR] [NAME ...] | html IN.ipynb OUT.html | "
          "html IN.ipynb [IN.ipynb ...] (each beside its notebook)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
