"""Names that exist so a module imports, and raise when actually used.

The stand-in modules under shims/ define a module-level ``__getattr__`` that
returns a Placeholder for any name: ``from sgl_kernel import foo`` succeeds at
import time; calling ``foo(...)`` raises NotImplementedError naming it, so a
code path that really needs the GPU kernel fails loudly instead of silently.
"""

from __future__ import annotations


class Placeholder:
    def __init__(self, qualname: str, reason: str):
        self._qualname = qualname
        self._reason = reason

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self._qualname} is not available here: {self._reason}")

    def __getattr__(self, name: str) -> "Placeholder":
        if name.startswith("__"):
            raise AttributeError(name)
        return Placeholder(f"{self._qualname}.{name}", self._reason)

    def __repr__(self) -> str:
        return f"<tangram cpu_compat placeholder {self._qualname}>"


def module_getattr(module_name: str, reason: str):
    """A module-level __getattr__ that hands out Placeholders (dunder names excluded)."""

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return Placeholder(f"{module_name}.{name}", reason)

    return __getattr__


class _PlaceholderSubmodules:
    """A meta path finder that makes every ``<package>.<sub>`` importable as a placeholder module."""

    def __init__(self, package: str, reason: str):
        self.package = package
        self.reason = reason

    def find_spec(self, fullname, path=None, target=None):
        import importlib.machinery

        if not fullname.startswith(self.package + "."):
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        import types

        module = types.ModuleType(spec.name)
        module.__path__ = []
        module.__getattr__ = module_getattr(spec.name, self.reason)
        return module

    def exec_module(self, module):
        pass


def install_submodule_placeholders(package: str, reason: str) -> None:
    """Let ``import package.any.sub`` succeed with placeholder modules (idempotent)."""
    import sys

    if not any(isinstance(f, _PlaceholderSubmodules) and f.package == package for f in sys.meta_path):
        sys.meta_path.append(_PlaceholderSubmodules(package, reason))
