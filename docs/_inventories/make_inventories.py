"""Write the intersphinx inventories in this folder from the installed packages.

Why this exists
    ``docs/conf.py`` links our API pages to the documentation of Python, PyTorch, GPyTorch,
    linear_operator, Pyro, NumPy, Matplotlib and torchmetrics with ``sphinx.ext.intersphinx``
    and builds with ``nitpicky = True``: every cross-reference must resolve. Intersphinx normally
    downloads each project's ``objects.inv``, but the docs are built offline (CI and the
    development machines have no internet access), so the inventories are generated here from
    the *installed* packages and committed next to this script. ``intersphinx_mapping`` names each
    project's real documentation as the link base and the local ``<project>.inv`` file as the
    inventory, so the built pages still link to the projects' own sites.

How to regenerate
    With the package and its docs extra installed (the versions the docs are built against)::

        python docs/_inventories/make_inventories.py            # all of them
        python docs/_inventories/make_inventories.py torch pyro # some of them

    It rewrites ``python.inv``, ``torch.inv``, ``gpytorch.inv``, ``linear_operator.inv``,
    ``pyro.inv``, ``numpy.inv``, ``matplotlib.inv`` and ``torchmetrics.inv`` and prints how many
    objects each holds. Regenerate after upgrading one of these packages, or when a docstring
    starts referring to a module that is not walked below (add it to the walk).

What an inventory holds
    The public API a user of this library meets (the modules walked below), each object under
    the name its project documents it by and under every alias it is re-exported or defined
    under (``torch.distributions.MultivariateNormal`` and
    ``torch.distributions.multivariate_normal.MultivariateNormal``; ``torch.nn.Module`` and
    ``torch.nn.modules.module.Module``, the name autodoc writes for an annotation or a base
    class), all pointing at the same page. Roles follow the object: ``py:module``, ``py:class``,
    ``py:exception``, ``py:function``, ``py:method``, ``py:attribute``, ``py:data``.

Link targets
    Each URI follows the project's documented URL layout (PyTorch's ``generated/<name>.html``
    pages, ``tensors.html#torch.Tensor``, ``distributions.html#torch.distributions.normal.Normal``;
    GPyTorch's ``kernels.html#gpytorch.kernels.RBFKernel``; Pyro's
    ``primitives.html#pyro.sample``, ``inference_algos.html#pyro.infer.svi.SVI``; Python's
    ``library/<module>.html#<name>``, ...). This is best effort: a few objects are not documented
    by their project at all and point at the page that would hold them, and CI does not check
    remote links (it has no internet).
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import sys
import types
import typing
import zlib
from collections.abc import Callable, Iterable
from importlib.metadata import version as dist_version
from pathlib import Path

HERE = Path(__file__).resolve().parent

# -- the inventory ---------------------------------------------------------------------------------


class Inventory:
    """Name -> (role, uri) of one project; a documented name wins over an alias of the same
    spelling, an earlier entry over a later one."""

    def __init__(self, project: str, version: str, roots: Iterable[str]):
        self.project, self.version = project, version
        self.roots = tuple(roots)
        self.primary: dict[str, tuple[str, str]] = {}
        self.aliases: dict[str, tuple[str, str]] = {}

    def owns(self, name: str) -> bool:
        return any(name == root or name.startswith(root + ".") for root in self.roots)

    def add(self, name: str, role: str, uri: str, alias: bool = False) -> None:
        if not self.owns(name):  # e.g. a gpytorch re-export of a linear_operator function
            return
        (self.aliases if alias else self.primary).setdefault(name, (role, uri))

    def entries(self) -> dict[str, tuple[str, str]]:
        merged = dict(self.aliases)
        merged.update(self.primary)
        return dict(sorted(merged.items()))

    def write(self, path: Path) -> int:
        entries = self.entries()
        lines = []
        for name, (role, uri) in entries.items():
            priority = 0 if role == "py:module" else 1
            if uri.endswith("#" + name):  # the inventory's shorthand: "$" is the object's name
                uri = uri[: -len(name)] + "$"
            lines.append(f"{name} {role} {priority} {uri} -\n")
        header = (
            "# Sphinx inventory version 2\n"
            f"# Project: {self.project}\n"
            f"# Version: {self.version}\n"
            "# The remainder of this file is compressed using zlib.\n"
        )
        body = zlib.compress("".join(lines).encode("utf-8"), 9)
        path.write_bytes(header.encode("utf-8") + body)
        return len(entries)


# -- introspection helpers -----------------------------------------------------------------------


def role_of(obj) -> str | None:
    """The inventory role of a module-level object (``None`` for a module)."""
    if isinstance(obj, types.ModuleType):
        return None
    if isinstance(obj, type):
        return "py:exception" if issubclass(obj, BaseException) else "py:class"
    if isinstance(obj, (typing._GenericAlias, typing._SpecialGenericAlias)):  # typing.List, ...
        return "py:class"
    if isinstance(obj, typing._SpecialForm):  # typing.Union, typing.Optional, ...
        return "py:data"
    if inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__qualname__")):
        return "py:function"
    return "py:data"


def member_role(value) -> str:
    if isinstance(value, (staticmethod, classmethod)) or inspect.isroutine(value):
        return "py:method"
    if isinstance(value, type):
        return "py:class"
    return "py:attribute"


def canonical(obj) -> str | None:
    """``obj.__module__ + "." + obj.__qualname__`` -- the name autodoc writes for the object
    (``None`` for a local object or a builtin bound to a private class, such as torch's
    ``_VariableFunctionsClass.zeros``)."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or "<" in qualname:
        return None
    if any(part.startswith("_") for part in qualname.split(".")[:-1]):
        return None
    return f"{module}.{qualname}"


def class_members(cls: type, inherited: bool = False) -> dict[str, str]:
    """Public members defined by the class (and, with ``inherited``, by its bases)."""
    classes = [c for c in cls.__mro__ if c is not object] if inherited else [cls]
    members: dict[str, str] = {}
    for klass in classes:
        for name, value in vars(klass).items():
            if not name.startswith("_") and name not in members:
                members[name] = member_role(value)
    return members


def public(module_name: str, prefixes: tuple[str, ...] | None = None,
           use_all: bool = True) -> list[tuple[str, object]]:
    """The public names of a module (its ``__all__``, or else every name without a leading
    underscore whose object is defined under one of ``prefixes``), modules left out."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) if use_all else None
    strict = names is None
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    else:  # plus what the module defines without listing it (os.PathLike is not in os.__all__)
        names = [*names, *(n for n, o in vars(module).items() if not n.startswith("_")
                           and getattr(o, "__module__", None) == module_name
                           and (isinstance(o, type) or inspect.isfunction(o)))]
    out = []
    for name in dict.fromkeys(names):
        if name.startswith("__"):
            continue
        try:
            obj = getattr(module, name)
        except AttributeError:
            continue
        if isinstance(obj, types.ModuleType):
            continue
        if strict and prefixes is not None and role_of(obj) != "py:data":
            # without __all__, keep what is defined here, not what the module merely imports
            where = getattr(obj, "__module__", None)
            if where is not None and not any(where == p or where.startswith(p + ".")
                                             for p in prefixes):
                continue
        out.append((name, obj))
    return out


def add_object(inv: Inventory, names: list[str], obj, uri: str,
               member_uri: Callable[[str], str] | None = None, members: bool = True,
               inherited: bool = False, role: str | None = None) -> None:
    """Register ``obj`` under ``names`` (the documented name first, then aliases) and its
    canonical name, and a class's public members under each of them. ``member_uri`` maps the
    member's documented name (``<names[0]>.<member>``) to its URI; by default the member is an
    anchor on the class's page. An object walked twice (a re-export) must get the same
    ``names[0]`` both times, or be skipped the second time."""
    role = role or role_of(obj)
    if role is None:
        return
    alias_names = list(names[1:])
    if (name := canonical(obj)) is not None and role != "py:data":
        alias_names.append(name)
    inv.add(names[0], role, uri)
    for alias in alias_names:
        inv.add(alias, role, uri, alias=True)
    if not (members and isinstance(obj, type)):
        return
    page = uri.split("#", 1)[0]
    for member, mrole in class_members(obj, inherited).items():
        documented = f"{names[0]}.{member}"
        muri = member_uri(documented) if member_uri else f"{page}#{documented}"
        inv.add(documented, mrole, muri)
        for alias in alias_names:
            inv.add(f"{alias}.{member}", mrole, muri, alias=True)


def add_module(inv: Inventory, name: str, uri: str) -> None:
    inv.add(name, "py:module", uri)


def add_objects(inv: Inventory, module: str, uri: Callable[[str], str], *,
                prefixes: tuple[str, ...] | None = None, role: Callable[[str], str | None] | None = None,
                skip_private: bool = False) -> None:
    """Every public object of ``module`` under its public name ``<module>.<name>``, at
    ``uri(full name)`` (``role(full name)`` overrides the role where it returns one)."""
    for name, obj in public(module, prefixes=prefixes):
        if skip_private and name.startswith("_"):
            continue
        full = f"{module}.{name}"
        add_object(inv, [full], obj, uri(full), role=role(full) if role else None)


# -- Python ---------------------------------------------------------------------------------------

PYTHON_MODULES = [
    "abc", "argparse", "collections", "collections.abc", "concurrent.futures", "contextlib",
    "copy", "csv", "dataclasses", "datetime", "enum", "functools", "gzip", "hashlib", "heapq",
    "importlib", "importlib.metadata", "importlib.util", "inspect", "io", "itertools", "json",
    "logging", "lzma", "math", "numbers", "operator", "os", "os.path", "pathlib", "pickle",
    "pkgutil", "platform", "queue", "random", "re", "resource", "shutil", "signal", "statistics",
    "string", "subprocess", "sys", "tempfile", "textwrap", "threading", "time", "traceback",
    "types", "typing", "uuid", "warnings", "weakref", "zipfile",
]
# modules documented on another module's page
PYTHON_PAGES = {"importlib.util": "library/importlib.html"}
# builtin types documented in "Built-in Types"; the other builtins are in "Built-in Functions"
PYTHON_STDTYPES = {"dict", "list", "tuple", "str", "set", "frozenset", "bytes", "bytearray",
                   "range", "memoryview"}
PYTHON_TYPES_WITH_METHODS = PYTHON_STDTYPES | {"int", "float", "complex"}
PYTHON_CONSTANTS = {"None", "True", "False", "NotImplemented", "Ellipsis", "__debug__",
                    "quit", "exit", "copyright", "credits", "license"}
# documented as classes although CPython implements them as factory functions
PYTHON_CLASSES = {"threading.Lock", "threading.RLock"}
# private implementation modules whose objects the stdlib re-exports (``_io.StringIO``)
PYTHON_IMPL_PREFIXES = ("_", "posix", "nt", "builtins")


def python_inventory() -> Inventory:
    roots = {m.split(".")[0] for m in PYTHON_MODULES}
    roots |= {n for n in dir(builtins) if not n.startswith("_")}
    roots |= {"_io", "_thread", "_collections_abc", "_pickle", "_csv", "_lzma", "_random",
              "_hashlib", "_json", "_operator", "_functools", "_weakref", "_weakrefset",
              "_contextvars", "_queue", "_abc", "_struct", "_datetime", "posix", "posixpath",
              "__debug__", "__import__"}
    inv = Inventory("Python", f"{sys.version_info.major}.{sys.version_info.minor}", roots)
    for name in dir(builtins):
        if name.startswith("_") and name not in ("__import__", "__debug__"):
            continue
        obj = getattr(builtins, name)
        if name in PYTHON_CONSTANTS:
            inv.add(name, "py:data" if name not in ("quit", "exit") else "py:function",
                    f"library/constants.html#{name}")
        elif isinstance(obj, type) and issubclass(obj, BaseException):
            add_object(inv, [name], obj, f"library/exceptions.html#{name}", members=False)
        elif isinstance(obj, type):
            page = "library/stdtypes.html" if name in PYTHON_STDTYPES else "library/functions.html"
            add_object(inv, [name], obj, f"{page}#{name}",
                       member_uri=lambda m: f"library/stdtypes.html#{m}",
                       members=name in PYTHON_TYPES_WITH_METHODS)
        else:
            inv.add(name, "py:function", f"library/functions.html#{name}")
    for module in PYTHON_MODULES:
        page = PYTHON_PAGES.get(module, f"library/{module}.html")
        add_module(inv, module, f"{page}#module-{module}")
        add_objects(inv, module, f"{page}#{{}}".format, prefixes=(module, *PYTHON_IMPL_PREFIXES),
                    role=lambda full: "py:class" if full in PYTHON_CLASSES else None)
    return inv


# -- PyTorch --------------------------------------------------------------------------------------

TORCH_PAGES = {  # top-level classes documented on a topic page rather than a generated one
    "Tensor": "tensors.html", "Size": "size.html", "dtype": "tensor_attributes.html",
    "device": "tensor_attributes.html", "layout": "tensor_attributes.html",
    "memory_format": "tensor_attributes.html", "finfo": "type_info.html",
    "iinfo": "type_info.html", "autocast": "amp.html", "TypedStorage": "storage.html",
    "UntypedStorage": "storage.html",
}
TORCH_TOPLEVEL_EXTRA = ["Tensor", "Size", "dtype", "device", "layout", "memory_format",
                        "Generator", "autocast", "finfo", "iinfo", "no_grad", "enable_grad",
                        "set_grad_enabled", "inference_mode"]


def torch_inventory() -> Inventory:
    import torch

    inv = Inventory("PyTorch", torch.__version__.split("+")[0], ["torch"])
    gen = "generated/{}.html#{}".format
    add_module(inv, "torch", "torch.html#module-torch")
    names = list(dict.fromkeys([*torch.__all__, *TORCH_TOPLEVEL_EXTRA]))
    for name in names:
        obj = getattr(torch, name, None)
        full = f"torch.{name}"
        if obj is None or isinstance(obj, types.ModuleType):
            continue
        if isinstance(obj, torch.dtype):  # torch.float32, ...: the dtype table
            inv.add(full, "py:data", "tensor_attributes.html#torch.dtype")
            continue
        if isinstance(obj, type):
            if name.endswith(("Storage", "Tensor")) and name not in TORCH_PAGES \
                    and name != "Tensor":
                continue  # the legacy typed tensors/storages: not documented one by one
            if obj.__module__.startswith("torch._C") and name not in TORCH_TOPLEVEL_EXTRA:
                continue  # C++ bindings exported for internal use
            if name == "Tensor":
                add_object(inv, [full], obj, "tensors.html#torch.Tensor",
                           member_uri=lambda m: gen(m, m), inherited=True)
                continue
            page = TORCH_PAGES.get(name)
            add_object(inv, [full], obj, f"{page}#{full}" if page else gen(full, full))
        elif callable(obj):
            add_object(inv, [full], obj, gen(full, full))
    # Tensor attributes that only the TensorBase C type defines are covered by inherited=True;
    # the transposes are documented on the tensors page itself
    for attr in ("T", "H", "mT", "mH"):
        inv.primary[f"torch.Tensor.{attr}"] = ("py:attribute", f"tensors.html#torch.Tensor.{attr}")

    # torch.nn: one generated page per class, its methods anchors on it
    add_module(inv, "torch.nn", "nn.html#module-torch.nn")
    for name, obj in public("torch.nn", prefixes=("torch.nn",)):
        if not isinstance(obj, type):
            continue
        full = f"torch.nn.{name}"
        if obj.__module__ == "torch.nn.parameter":  # documented as torch.nn.parameter.<name>
            documented = f"torch.nn.parameter.{name}"
            add_object(inv, [documented, full], obj, gen(documented, documented))
        else:
            add_object(inv, [full], obj, gen(full, full))
    add_module(inv, "torch.nn.functional", "nn.functional.html#module-torch.nn.functional")
    for name, obj in public("torch.nn.functional",
                            prefixes=("torch.nn.functional", "torch._C._nn", "torch")):
        if isinstance(obj, type) or not callable(obj):
            continue
        full = f"torch.nn.functional.{name}"
        add_object(inv, [full], obj, gen(full, full))
    add_module(inv, "torch.nn.parallel", "nn.html#module-torch.nn.parallel")
    for name, obj in public("torch.nn.parallel"):
        full = f"torch.nn.parallel.{name}"
        if name == "DataParallel":  # documented as torch.nn.DataParallel
            continue
        add_object(inv, [full], obj, gen(full, full))
    add_module(inv, "torch.nn.init", "nn.init.html#module-torch.nn.init")
    for name, obj in public("torch.nn.init", prefixes=("torch.nn.init",)):
        if callable(obj) and not isinstance(obj, type):
            add_object(inv, [f"torch.nn.init.{name}"], obj,
                       f"nn.init.html#torch.nn.init.{name}")

    # torch.distributions: one page, every object documented under its defining module
    add_module(inv, "torch.distributions", "distributions.html#module-torch.distributions")
    for sub in ("kl", "constraints", "transforms", "constraint_registry"):
        add_module(inv, f"torch.distributions.{sub}",
                   f"distributions.html#module-torch.distributions.{sub}")
    for module in ("torch.distributions", "torch.distributions.kl",
                   "torch.distributions.constraints", "torch.distributions.transforms",
                   "torch.distributions.constraint_registry"):
        for name, obj in public(module):
            public_name = f"{module}.{name}"
            documented = canonical(obj) if role_of(obj) != "py:data" else None
            documented = documented or public_name
            add_object(inv, [documented, public_name], obj,
                       f"distributions.html#{documented}")

    # torch.optim
    add_module(inv, "torch.optim", "optim.html#module-torch.optim")
    for name, obj in public("torch.optim"):
        full = f"torch.optim.{name}"
        if name == "Optimizer":  # the base class on optim.html, its methods generated pages
            add_object(inv, [full], obj, f"optim.html#{full}", member_uri=lambda m: gen(m, m))
        else:
            add_object(inv, [full], obj, gen(full, full))
    add_module(inv, "torch.optim.lr_scheduler", "optim.html#module-torch.optim.lr_scheduler")
    add_objects(inv, "torch.optim.lr_scheduler", lambda full: gen(full, full))

    # torch.utils.data: one page
    add_module(inv, "torch.utils.data", "data.html#module-torch.utils.data")
    add_objects(inv, "torch.utils.data", "data.html#{}".format, skip_private=True)

    # torch.linalg: generated pages
    add_module(inv, "torch.linalg", "linalg.html#module-torch.linalg")
    add_objects(inv, "torch.linalg", lambda full: gen(full, full),
                prefixes=("torch.linalg", "torch._C._linalg"))
    return inv


# -- GPyTorch -------------------------------------------------------------------------------------

GPYTORCH_PAGES = {  # subpackage -> page of the GPyTorch docs
    "kernels": "kernels.html", "distributions": "distributions.html",
    "variational": "variational.html", "constraints": "constraints.html",
    "settings": "settings.html", "likelihoods": "likelihoods.html", "means": "means.html",
    "models": "models.html", "priors": "priors.html", "mlls": "marginal_log_likelihoods.html",
    "optim": "optim.html", "utils": "utils.html", "metrics": "metrics.html",
}


def gpytorch_inventory() -> Inventory:
    import gpytorch

    inv = Inventory("GPyTorch", gpytorch.__version__, ["gpytorch"])
    add_module(inv, "gpytorch", "module.html#module-gpytorch")
    for name, obj in public("gpytorch"):
        full = f"gpytorch.{name}"
        if name == "Module":
            add_object(inv, [full], obj, f"module.html#{full}")
        elif name == "ExactMarginalLogLikelihood":  # re-export of gpytorch.mlls
            documented = f"gpytorch.mlls.{name}"
            add_object(inv, [documented, full], obj,
                       f"marginal_log_likelihoods.html#{documented}")
        elif callable(obj) and not isinstance(obj, type):
            add_object(inv, [full], obj, f"functions.html#{full}")
    for sub, page in GPYTORCH_PAGES.items():
        module = f"gpytorch.{sub}"
        add_module(inv, module, f"{page}#module-{module}")
        add_objects(inv, module, f"{page}#{{}}".format, prefixes=("gpytorch",))
    return inv


# -- linear_operator ------------------------------------------------------------------------------

LINOP_DATA_SPARSE = {"BlockDiagLinearOperator", "CholLinearOperator",
                     "ConstantDiagLinearOperator", "DiagLinearOperator", "RootLinearOperator",
                     "ToeplitzLinearOperator", "ZeroLinearOperator"}
LINOP_COMPOSITION = {"AddedDiagLinearOperator", "CatLinearOperator",
                     "ConstantMulLinearOperator", "InterpolatedLinearOperator",
                     "KroneckerProductLinearOperator", "KroneckerProductDiagLinearOperator",
                     "MaskedLinearOperator", "MatmulLinearOperator", "MulLinearOperator",
                     "PsdSumLinearOperator", "SumBatchLinearOperator"}


def linear_operator_page(cls: type) -> str:
    """The page documenting an operator: its own section, or that of its nearest documented
    base (operators the docs do not list themselves sit on their family's page)."""
    for klass in cls.__mro__:
        if klass.__name__ == "LinearOperator":
            break
        if klass.__name__ in LINOP_DATA_SPARSE:
            return "data_sparse_operators.html"
        if klass.__name__ in LINOP_COMPOSITION:
            return "composition_decoration_operators.html"
        if klass.__name__ == "TriangularLinearOperator":
            return "structure.html"
    if cls.__name__ == "LinearOperator":
        return "linear_operator.html"
    if "Added" in cls.__name__ or "Sum" in cls.__name__ or "Kronecker" in cls.__name__:
        return "composition_decoration_operators.html"
    return "data_sparse_operators.html"


def linear_operator_inventory() -> Inventory:
    import linear_operator

    inv = Inventory("linear_operator", linear_operator.__version__, ["linear_operator"])
    add_module(inv, "linear_operator", "namespace.html#module-linear_operator")
    for name, obj in public("linear_operator"):
        full = f"linear_operator.{name}"
        if name == "LinearOperator":
            add_object(inv, [full, f"linear_operator.operators.{name}"], obj,
                       f"linear_operator.html#{full}")
        elif callable(obj) and not isinstance(obj, type):
            add_object(inv, [full], obj, f"namespace.html#{full}")
    add_module(inv, "linear_operator.operators",
               "data_sparse_operators.html#module-linear_operator.operators")
    for name, obj in public("linear_operator.operators"):
        full = f"linear_operator.operators.{name}"
        if name == "LinearOperator":  # registered above, documented as linear_operator.<name>
            continue
        if isinstance(obj, type):
            add_object(inv, [full], obj, f"{linear_operator_page(obj)}#{full}")
        elif callable(obj):  # to_dense, to_linear_operator, cat: package functions
            add_object(inv, [full], obj, f"namespace.html#{full}")
    add_module(inv, "linear_operator.utils", "utils.html#module-linear_operator.utils")
    for module in ("linear_operator.utils", "linear_operator.utils.lanczos",
                   "linear_operator.utils.sparse", "linear_operator.utils.cholesky",
                   "linear_operator.utils.errors", "linear_operator.utils.warnings"):
        for name, obj in public(module, prefixes=("linear_operator.utils",), use_all=False):
            full = f"{module}.{name}"
            add_object(inv, [full], obj, f"utils.html#{full}")
    add_module(inv, "linear_operator.settings", "settings.html#module-linear_operator.settings")
    for name, obj in public("linear_operator.settings", prefixes=("linear_operator.settings",)):
        full = f"linear_operator.settings.{name}"
        add_object(inv, [full], obj, f"settings.html#{full}")
    return inv


# -- Pyro -----------------------------------------------------------------------------------------

# modules of pyro.infer whose objects the "SVI / ELBO / Importance / ..." page documents under
# their defining module (``inference_algos.html#pyro.infer.svi.SVI``)
PYRO_INFER_PAGES = {"pyro.infer.mcmc": "mcmc.html", "pyro.infer.autoguide": "infer.autoguide.html",
                    "pyro.infer.reparam": "infer.reparam.html", "pyro.infer.util": "infer.util.html",
                    "pyro.infer.enum": "poutine.html"}


def pyro_inventory() -> Inventory:
    import pyro

    inv = Inventory("Pyro", pyro.__version__, ["pyro"])
    # primitives: documented as pyro.<name> on primitives.html
    add_module(inv, "pyro", "primitives.html#module-pyro")
    add_module(inv, "pyro.primitives", "primitives.html#module-pyro.primitives")
    for name, obj in public("pyro"):
        full = f"pyro.{name}"
        if role_of(obj) == "py:data" or name == "log":
            continue
        names = [full]
        if getattr(obj, "__module__", "") == "pyro.primitives":
            names.append(f"pyro.primitives.{name}")
        add_object(inv, names, obj, f"primitives.html#{full}")

    # pyro.distributions: documented as pyro.distributions.<name>
    add_module(inv, "pyro.distributions", "distributions.html#module-pyro.distributions")
    for module in ("pyro.distributions", "pyro.distributions.constraints",
                   "pyro.distributions.transforms"):
        if module != "pyro.distributions":
            add_module(inv, module, f"distributions.html#module-{module}")
        add_objects(inv, module, "distributions.html#{}".format)

    # pyro.infer: each documented under its defining module, on its topic page
    add_module(inv, "pyro.infer", "inference.html#module-pyro.infer")
    for module in ("pyro.infer", "pyro.infer.autoguide", "pyro.infer.reparam",
                   "pyro.infer.mcmc"):
        if module != "pyro.infer":
            add_module(inv, module, f"{PYRO_INFER_PAGES[module]}#module-{module}")
        for name, obj in public(module):
            public_name = f"{module}.{name}"
            where = getattr(obj, "__module__", "") or ""
            page = next((p for m, p in PYRO_INFER_PAGES.items()
                         if where == m or where.startswith(m + ".")), "inference_algos.html")
            if page == "infer.autoguide.html":  # autoclass'd by their public name
                documented = f"pyro.infer.autoguide.{name}"
            elif page == "mcmc.html" and name in ("HMC", "NUTS"):
                documented = f"pyro.infer.mcmc.{name}"
            else:
                documented = canonical(obj) or public_name
            add_object(inv, [documented, public_name], obj, f"{page}#{documented}")

    # pyro.poutine: handlers and Trace by public name, the rest by defining module
    add_module(inv, "pyro.poutine", "poutine.html#module-pyro.poutine")
    for name, obj in public("pyro.poutine"):
        public_name = f"pyro.poutine.{name}"
        where = getattr(obj, "__module__", "") or ""
        documented = public_name if where in ("pyro.poutine.handlers", "pyro.poutine.trace_struct") \
            else (canonical(obj) or public_name)
        add_object(inv, [documented, public_name], obj, f"poutine.html#{documented}")
    for module in ("pyro.poutine.runtime", "pyro.poutine.util", "pyro.poutine.messenger",
                   "pyro.poutine.trace_messenger", "pyro.poutine.plate_messenger"):
        add_module(inv, module, f"poutine.html#module-{module}")
        add_objects(inv, module, "poutine.html#{}".format, prefixes=(module,))

    # pyro.optim: the "Pyro Optimizers" automodule documents them as pyro.optim.<name>
    add_module(inv, "pyro.optim", "optimization.html#module-pyro.optim")
    add_objects(inv, "pyro.optim", "optimization.html#{}".format, skip_private=True)

    # pyro.nn: documented under the defining module
    add_module(inv, "pyro.nn", "nn.html#module-pyro.nn")
    for name, obj in public("pyro.nn"):
        public_name = f"pyro.nn.{name}"
        documented = canonical(obj) or public_name
        add_object(inv, [documented, public_name], obj, f"nn.html#{documented}")

    # the parameter store
    add_module(inv, "pyro.params", "parameters.html#module-pyro.params")
    for name, obj in public("pyro.params.param_store", prefixes=("pyro.params",)):
        full = f"pyro.params.param_store.{name}"
        add_object(inv, [full], obj, f"parameters.html#{full}")
    return inv


# -- NumPy, Matplotlib, torchmetrics (the few objects our annotations and docstrings name) --------


def numpy_inventory() -> Inventory:
    import numpy as np

    inv = Inventory("NumPy", np.__version__, ["numpy"])
    gen = "reference/generated/{}.html#{}".format
    add_module(inv, "numpy", "reference/index.html#module-numpy")
    for name, obj in public("numpy"):
        full = f"numpy.{name}"
        if name == "ndarray" or name == "dtype":
            add_object(inv, [full], obj, gen(full, full), member_uri=lambda m: gen(m, m))
        elif isinstance(obj, type) and issubclass(obj, np.generic):
            add_object(inv, [full], obj, f"reference/arrays.scalars.html#{full}",
                       members=False)
        elif isinstance(obj, type) or callable(obj):
            add_object(inv, [full], obj, gen(full, full), members=False)
        elif name in ("pi", "e", "inf", "nan", "newaxis", "euler_gamma"):
            inv.add(full, "py:data", f"reference/constants.html#{full}")
    add_module(inv, "numpy.typing", "reference/typing.html#module-numpy.typing")
    for name in ("ArrayLike", "DTypeLike", "NDArray"):
        inv.add(f"numpy.typing.{name}", "py:data", f"reference/typing.html#numpy.typing.{name}")
    return inv


def matplotlib_inventory() -> Inventory:
    import matplotlib
    import matplotlib.axes
    import matplotlib.figure

    inv = Inventory("Matplotlib", matplotlib.__version__, ["matplotlib"])
    gen = "api/_as_gen/{}.html#{}".format
    add_module(inv, "matplotlib.figure", "api/figure_api.html#module-matplotlib.figure")
    for name in ("Figure", "SubFigure", "FigureBase"):
        full = f"matplotlib.figure.{name}"
        add_object(inv, [full], getattr(matplotlib.figure, name), gen(full, full),
                   member_uri=lambda m: gen(m, m))
    add_module(inv, "matplotlib.axes", "api/axes_api.html#module-matplotlib.axes")
    add_object(inv, ["matplotlib.axes.Axes"], matplotlib.axes.Axes,
               "api/axes_api.html#matplotlib.axes.Axes", member_uri=lambda m: gen(m, m),
               inherited=True)
    return inv


def torchmetrics_inventory() -> Inventory:
    import torchmetrics

    inv = Inventory("torchmetrics", torchmetrics.__version__, ["torchmetrics"])
    add_object(inv, ["torchmetrics.Metric"], torchmetrics.Metric,
               "references/metric.html#torchmetrics.Metric")
    return inv


INVENTORIES = {
    "python": python_inventory,
    "torch": torch_inventory,
    "gpytorch": gpytorch_inventory,
    "linear_operator": linear_operator_inventory,
    "pyro": pyro_inventory,
    "numpy": numpy_inventory,
    "matplotlib": matplotlib_inventory,
    "torchmetrics": torchmetrics_inventory,
}
# the installed distribution each inventory was generated from (printed for the record)
DISTRIBUTIONS = {"torch": "torch", "gpytorch": "gpytorch", "linear_operator": "linear_operator",
                 "pyro": "pyro-ppl", "numpy": "numpy", "matplotlib": "matplotlib",
                 "torchmetrics": "torchmetrics"}


def main(argv: list[str] | None = None) -> int:
    import warnings

    warnings.simplefilter("ignore")  # deprecation noise from walking whole namespaces
    selected = (argv if argv is not None else sys.argv[1:]) or list(INVENTORIES)
    for key in selected:
        inv = INVENTORIES[key]()
        count = inv.write(HERE / f"{key}.inv")
        origin = (f"{DISTRIBUTIONS[key]} {dist_version(DISTRIBUTIONS[key])}"
                  if key in DISTRIBUTIONS else f"Python {inv.version}")
        print(f"{key}.inv: {count} objects ({origin})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
