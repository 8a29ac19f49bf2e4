"""Loading a pinned peer's functions without its import-time dependencies.

A peer wheel is installed with `--no-deps`: its top-level packages import servers, tokenizers
and CUDA extensions that the functions under test never touch. These helpers load just what is
needed, from the installed files, at run time (nothing of the peer is copied into Lockstep):

- `bare_packages("sglang.kernels.ops")` registers each package of a dotted path as a namespace
  whose `__path__` is the installed folder, so a leaf module imports without running the
  package `__init__` chain above it;
- `stub_module(name, **attrs)` stands in for one heavy module the leaf imports, with the few
  names it needs (each stub is listed by the adapter that installs it);
- `function_from_source(module, name, namespace)` compiles one top-level function of an
  installed module file whose other imports are too heavy, with the file's own name in
  tracebacks;
- `require(...)` checks a symbol and its parameters, and otherwise raises UpstreamChanged naming
  the symbol, so a moved or re-signed upstream function is refused, never half-called;
- `only_programs(kernel, keep)` runs, in Triton's interpreter, only the programs of a peer
  kernel's launches whose output the adapter reads (the peer's own code and grid unchanged).
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import inspect
import linecache
import os
import sys
import types

from lockstep.harness.target import NotApplicable, UpstreamChanged


def installed_version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def require_version(dist: str, pinned: str) -> None:
    found = installed_version(dist)
    if found is None:
        raise NotApplicable(f"{dist} is not installed (pip install --no-deps {dist}=={pinned})")
    if found != pinned:
        raise UpstreamChanged(f"{dist} {found} is installed; this adapter is pinned to {dist}=={pinned}")


def package_root(top: str) -> str:
    spec = importlib.util.find_spec(top) if top not in sys.modules else None
    if spec is not None and spec.origin:
        return os.path.dirname(spec.origin)
    mod = sys.modules.get(top)
    if mod is not None and getattr(mod, "__path__", None):
        return list(mod.__path__)[0]
    raise NotApplicable(f"package {top!r} is not installed")


def bare_packages(dotted: str) -> None:
    """Register `a`, `a.b`, `a.b.c` as namespaces over their installed folders (unless imported)."""
    parts = dotted.split(".")
    root = package_root(parts[0])
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if name in sys.modules:
            continue
        folder = os.path.join(root, *parts[1:i])
        if not os.path.isdir(folder):
            raise UpstreamChanged(f"package {name} is gone from the installed {parts[0]} (no folder {folder})")
        mod = types.ModuleType(name)
        mod.__path__ = [folder]
        mod.__package__ = name
        mod.__file__ = None
        sys.modules[name] = mod


def stub_module(name: str, **attrs) -> types.ModuleType:
    """Stand in for one heavy module (only if it is not imported already)."""
    if name in sys.modules and not getattr(sys.modules[name], "__lockstep_stub__", False):
        return sys.modules[name]
    mod = types.ModuleType(name)
    mod.__lockstep_stub__ = True
    mod.__dict__.update(attrs)
    sys.modules[name] = mod
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, mod)
    return mod


def import_leaf(module: str) -> types.ModuleType:
    """Import one leaf module of a peer through bare parent packages."""
    bare_packages(module.rpartition(".")[0])
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UpstreamChanged(f"importing {module} failed: {e}") from None


def module_file(module: str) -> str:
    top = module.split(".")[0]
    path = os.path.join(package_root(top), *module.split(".")[1:]) + ".py"
    if not os.path.isfile(path):
        raise UpstreamChanged(f"module {module} is gone (no file {path})")
    return path


def function_from_source(module: str, name: str, namespace: dict, strip_decorators: bool = False,
                         transform=None):
    """Compile the top-level function `name` of the installed file of `module` into `namespace`
    (shared: several functions compiled into one namespace see each other). `transform(text)`
    edits the file's text first — only tests use it, to break a peer on purpose."""
    path = module_file(module)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if transform is not None:
        edited = transform(text)
        if edited == text:
            raise UpstreamChanged(f"{module}: the edit asked for does not apply to {path}")
        text = edited
    tree = ast.parse(text, filename=path)
    found = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            found = node
            break
    if found is None:
        raise UpstreamChanged(f"{module}.{name} is gone from {path}")
    if strip_decorators:
        found.decorator_list = []
    mod = ast.Module(body=[found], type_ignores=[])
    namespace.setdefault("__name__", module)
    if transform is not None:                 # triton reads a kernel's source from the file: keep it in
        # the edited text (the line numbers are those of the file)
        path = f"<{module} as edited for a test>"
        linecache.cache[path] = (len(text), None, text.splitlines(True), path)
    exec(compile(mod, path, "exec"), namespace)
    return namespace[name]


def method_from_source(module: str, cls: str, name: str, namespace: dict):
    """A method of a top-level class of an installed file, compiled as a plain function."""
    path = module_file(module)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    ns = dict(namespace)
                    ns.setdefault("__name__", module)
                    exec(compile(ast.Module(body=[item], type_ignores=[]), path, "exec"), ns)
                    return ns[name]
            raise UpstreamChanged(f"{module}.{cls}.{name} is gone from {path}")
    raise UpstreamChanged(f"{module}.{cls} is gone from {path}")


def require(obj, qualname: str, params: list[str] | None = None):
    """`obj` must exist and take at least `params` (by name, in order); returns it."""
    if obj is None:
        raise UpstreamChanged(f"{qualname} is gone")
    if params is not None:
        fn = getattr(obj, "fn", obj)           # a triton.jit function keeps the Python one in .fn
        try:
            got = list(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            raise UpstreamChanged(f"{qualname}: cannot read its signature") from None
        if got[:len(params)] != params:
            raise UpstreamChanged(f"{qualname} changed signature: expected parameters {params}, found {got}")
    return obj


def attr(mod: types.ModuleType, name: str, params: list[str] | None = None):
    return require(getattr(mod, name, None), f"{mod.__name__}.{name}", params)


def module_from_source(module: str, transform, name: str) -> types.ModuleType:
    """The installed module `module`, its text edited by `transform`, loaded as a new module
    `name` (for tests that break a peer kernel on purpose; the real module is untouched)."""

    path = module_file(module)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    edited = transform(text)
    if edited == text:
        raise UpstreamChanged(f"{module}: the edit asked for does not apply to {path}")
    fake = f"<{module} as edited for a test>"
    linecache.cache[fake] = (len(edited), None, edited.splitlines(True), fake)
    mod = types.ModuleType(name)
    mod.__file__ = fake
    mod.__package__ = module.rpartition(".")[0]
    sys.modules[name] = mod
    exec(compile(edited, fake, "exec"), mod.__dict__)
    return mod


@contextlib.contextmanager
def only_programs(kernel, keep):
    """Within the block, an interpreted launch of the peer's `@triton.jit` function `kernel` runs
    the program at grid index (x, y, z) only if keep((x, y, z), args) (`args`: the launch's
    arguments by name, constexprs as given). For an adapter whose caller reads only some of a
    launch's output rows: the programs it runs see the same grid, index and arguments as in the
    whole launch, so they compute the same bits; the others write nothing (the adapter must not
    read their rows), which is only sound for a kernel whose programs write disjoint outputs and
    read nothing another program writes. A compiled kernel (a GPU) runs its whole grid."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        interpreter = None
    builder = getattr(interpreter, "interpreter_builder", None)
    if builder is None or not isinstance(kernel, getattr(interpreter, "InterpretedFunction", ())) \
            or not callable(getattr(kernel, "rewrite", None)):
        yield                           # compiled, or an interpreter without these hooks: the whole grid
        return
    shipped = kernel.rewrite

    def rewrite():
        fn = shipped()

        def program(**args):
            idx = getattr(builder, "grid_idx", None)
            if idx is None or keep(idx, args):          # no grid index to judge by: run it
                return fn(**args)
        # The interpreter reads the program's signature and constexpr annotations, and patches the
        # triton.language modules its globals name: those of the kernel's own module.
        program = types.FunctionType(program.__code__, fn.__globals__, fn.__name__, None, program.__closure__)
        program.__signature__, program.__annotations__ = inspect.signature(fn), dict(fn.__annotations__)
        return program

    kernel.rewrite = rewrite
    try:
        yield
    finally:
        del kernel.rewrite
