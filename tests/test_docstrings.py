"""Every public name is documented, and every example in the docstrings runs.

The public names are read from the ``__all__`` lists of :mod:`dignn_kernels`,
:mod:`dignn_kernels.ops`, :mod:`dignn_kernels.distributed` and :mod:`dignn` (never typed here),
so a name added to an ``__all__`` without a docstring fails. Functions and classes need a
Google-style docstring (the API reference renders it with napoleon): an ``Args:`` section when
they take arguments (for classes: the constructor's), ``Returns:`` when a function returns
something, and an ``Example`` section; the public methods of a class need a docstring. Module
objects need a docstring; constants a ``#:`` comment (or a string after the assignment), which
is what autodoc shows for them.

The examples run with :mod:`doctest` in empty globals, as ``sphinx.ext.doctest`` runs them in
the docs build: each imports what it uses.
"""
import ast
import doctest
import importlib
import importlib.util
import inspect
import textwrap
import types

import pytest

PACKAGES = ("dignn_kernels", "dignn_kernels.ops", "dignn_kernels.distributed", "dignn")
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _public_names():
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names += [(package, name) for name in module.__all__]
    return names


PUBLIC = _public_names()


def _obj(package: str, name: str):
    return getattr(importlib.import_module(package), name)


def _own_doc(obj):
    """The object's own docstring (a class's, not one it inherits)."""
    doc = obj.__dict__.get("__doc__") if inspect.isclass(obj) else getattr(obj, "__doc__", None)
    return inspect.cleandoc(doc) if isinstance(doc, str) and doc.strip() else None


def _has_section(doc: str, *titles: str) -> bool:
    lines = [line.strip() for line in doc.splitlines()]
    return any(line.rstrip(":") in titles and line.endswith(":") for line in lines)


def _takes_arguments(func, bound: bool = False) -> bool:
    params = list(inspect.signature(func).parameters.values())
    if bound:
        params = params[1:]
    return bool(params)


def _returns_something(func) -> bool:
    """What the signature says; without an annotation, whether the body returns a value."""
    annotation = inspect.signature(func).return_annotation
    if annotation is not inspect.Signature.empty:
        return annotation not in (None, "None", type(None))
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(func))))
    body = tree.body[0]
    todo, returns = list(body.body), False
    while todo:  # the function's own returns, not those of nested functions
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, ast.Return) and node.value is not None:
            returns = True
        todo.extend(ast.iter_child_nodes(node))
    return returns


def _data_documented(module_name: str, name: str, seen=()) -> bool:
    """Whether the assignment of ``name`` in ``module_name`` (or in the module it is imported
    from) carries a ``#:`` comment above it or a string right after it (autodoc's forms)."""
    module = importlib.import_module(module_name)
    source = inspect.getsource(module)
    lines = source.splitlines()
    tree = ast.parse(source)
    for k, node in enumerate(tree.body):
        targets = (node.targets if isinstance(node, ast.Assign) else
                   [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            after = tree.body[k + 1] if k + 1 < len(tree.body) else None
            return above.startswith("#:") or (
                isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str))
        if isinstance(node, ast.ImportFrom) and any(
                (a.asname or a.name) == name for a in node.names):
            package = module_name if hasattr(module, "__path__") else \
                module_name.rpartition(".")[0]
            source_module = importlib.util.resolve_name(
                "." * node.level + (node.module or ""), package) if node.level else node.module
            if source_module in seen:
                return False
            return _data_documented(source_module, name, seen + (module_name,))
    return False


@pytest.mark.parametrize("package,name", PUBLIC, ids=[f"{p}.{n}" for p, n in PUBLIC])
def test_public_name_is_documented(package, name):
    obj = _obj(package, name)
    where = f"{package}.{name}"
    if isinstance(obj, types.ModuleType):
        assert _own_doc(obj), f"module {where} has no docstring"
        return
    if not (inspect.isclass(obj) or callable(obj)):  # a constant
        assert _data_documented(package, name), (
            f"{where} has no '#:' comment above its assignment (nor a string after it): "
            f"autodoc shows nothing for it")
        return
    doc = _own_doc(obj)
    assert doc, f"{where} has no docstring"
    missing = []
    if inspect.isclass(obj):
        is_exception = issubclass(obj, BaseException)
        if not is_exception and _takes_arguments(obj):
            if not _has_section(doc, "Args", "Arguments", "Attributes"):
                missing.append("Args: (the constructor's arguments)")
    else:
        if _takes_arguments(obj) and not _has_section(doc, "Args", "Arguments"):
            missing.append("Args:")
        if _returns_something(obj) and not _has_section(doc, "Returns", "Yields"):
            missing.append("Returns:")
    if not _has_section(doc, "Example", "Examples"):
        missing.append("Example:")
    assert not missing, f"the docstring of {where} has no {', '.join(missing)} section"


def _public_classes():
    return [(p, n) for p, n in PUBLIC if inspect.isclass(_obj(p, n))
            and not issubclass(_obj(p, n), BaseException)]


@pytest.mark.parametrize("package,name", _public_classes(),
                         ids=[f"{p}.{n}" for p, n in _public_classes()])
def test_public_methods_are_documented(package, name):
    cls = _obj(package, name)
    undocumented = []
    for attr, value in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(value, (staticmethod, classmethod)):
            value = value.__func__
        if isinstance(value, property) or inspect.isfunction(value):
            if not _own_doc(value):
                undocumented.append(attr)
    assert not undocumented, f"{package}.{name}: no docstring on {undocumented}"


def test_layer_docstring_is_the_class_doc():
    """The docstring must be the class's first statement: a class attribute above it made
    ``__doc__`` None and ``help()`` show nothing."""
    from dignn_kernels import FusedImplicitDiffusion
    assert FusedImplicitDiffusion.__doc__ is not None
    assert "implicit graph diffusion layer" in FusedImplicitDiffusion.__doc__
    assert "Args:" in FusedImplicitDiffusion.__doc__


def _example_modules():
    """The modules that define the public names (and the packages themselves)."""
    names = set(PACKAGES)
    for package, name in PUBLIC:
        obj = _obj(package, name)
        module = obj if isinstance(obj, types.ModuleType) else inspect.getmodule(obj)
        if module is not None:
            names.add(module.__name__)
    return sorted(names)


EXAMPLE_MODULES = _example_modules()


@pytest.mark.parametrize("module_name", EXAMPLE_MODULES)
def test_docstring_examples_run(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = [t for t in finder.find(module, globs={}) if t.examples]
    failures = []
    try:
        for test in tests:
            out = []
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            result = runner.run(test, out=out.append, clear_globs=True)
            if result.failed:
                failures.append("".join(out))
    finally:  # an example that stopped before destroying its process group: no leak
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    assert not failures, ("docstring examples run in empty globals, as sphinx's doctest builder "
                          "runs them: each imports what it uses\n" + "\n".join(failures))


def test_every_public_name_has_a_running_example():
    """The ``Example`` section of each public function and class holds ``>>>`` lines (which
    the doctest run above executes), not only prose."""
    without = []
    for package, name in PUBLIC:
        obj = _obj(package, name)
        if isinstance(obj, types.ModuleType) or not (inspect.isclass(obj) or callable(obj)):
            continue
        if ">>>" not in (_own_doc(obj) or ""):
            without.append(f"{package}.{name}")
    assert not without, f"no '>>>' example in the docstrings of {without}"
