"""The modules a training script imports say what they export (``__all__``) and document it in Google style: every
public function and method that takes arguments has an ``Args:`` section, every one that returns something a
``Returns:`` section, and every dataclass field a docstring of its own."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest

#: The modules users import (docs/checkpoints.md; ddpjob_worker/__init__.py maps the package).
USER_MODULES = ("checkpoint", "progress", "sampler", "globalbatch")
#: Return annotations that mean nothing is returned.
NOTHING = ("None", "NoReturn")


def _takes_arguments(signature: inspect.Signature) -> bool:
    return any(name not in ("self", "cls") for name in signature.parameters)


def _returns_something(signature: inspect.Signature) -> bool:
    annotation = signature.return_annotation
    return annotation is not inspect.Signature.empty and str(annotation) not in NOTHING


def _own_init(cls: type) -> Callable[..., Any] | None:
    """The constructor this package wrote for the class (by hand or as a dataclass); None for one from elsewhere
    (object's, Exception's, a Protocol's, torch's DistributedSampler's)."""
    init = next((klass.__dict__["__init__"] for klass in cls.__mro__ if "__init__" in klass.__dict__), None)
    return init if str(getattr(init, "__module__", "")).startswith("ddpjob_worker") else None


def _undocumented_fields(cls: type) -> list[str]:
    """Fields of a dataclass without the docstring line under them (as CheckpointConfig's have)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    documented = {stmt.target.id for stmt, after in zip(body, [*body[1:], None], strict=True)
                  if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                  and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                  and isinstance(after.value.value, str)}
    return [f.name for f in dataclasses.fields(cls) if f.name not in documented]


def _problems(name: str, obj: Any, signature: inspect.Signature | None, *, method: bool) -> Iterator[str]:
    doc = inspect.getdoc(obj) or ""
    if not doc:
        yield f"{name}: no docstring"
        return
    if signature is None:
        return
    if _takes_arguments(signature) and "Args:" not in doc:
        yield f"{name}: takes arguments, but its docstring has no Args: section"
    if method and _returns_something(signature) and "Returns:" not in doc:
        yield f"{name}: returns {signature.return_annotation}, but its docstring has no Returns: section"


def _public_methods(cls: type) -> Iterator[tuple[str, Any, inspect.Signature | None]]:
    for attr, raw in vars(cls).items():
        if attr.startswith("_"):
            continue
        if isinstance(raw, property):
            yield attr, raw, None
        elif isinstance(raw, (staticmethod, classmethod)) or inspect.isfunction(raw):
            function = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            yield attr, getattr(cls, attr), inspect.signature(function)


def problems_of(module_name: str) -> list[str]:
    """What the module's public names lack."""
    module = importlib.import_module(f"ddpjob_worker.{module_name}")
    found: list[str] = []
    for name in module.__all__:
        obj = getattr(module, name)
        where = f"ddpjob_worker.{module_name}.{name}"
        if inspect.isclass(obj):
            if not (obj.__doc__ or "").strip():
                found.append(f"{where}: no docstring")
            init = _own_init(obj)
            if dataclasses.is_dataclass(obj):  # its fields are its arguments, each with its docstring line
                found += [f"{where}.{field}: no docstring" for field in _undocumented_fields(obj)]
            elif init is not None and _takes_arguments(inspect.signature(init)) and "Args:" not in (
                    (obj.__doc__ or "") + (init.__doc__ or "")):
                found.append(f"{where}: its constructor takes arguments, but no docstring has an Args: section")
            for attr, member, member_signature in _public_methods(obj):
                found += _problems(f"{where}.{attr}", member, member_signature, method=True)
        elif callable(obj):
            found += _problems(where, obj, inspect.signature(obj), method=True)
    return found


@pytest.mark.parametrize("module_name", USER_MODULES)
def test_a_user_module_says_what_it_exports(module_name: str) -> None:
    module = importlib.import_module(f"ddpjob_worker.{module_name}")
    exported = getattr(module, "__all__", None)
    assert isinstance(exported, list) and exported, f"ddpjob_worker.{module_name} has no __all__"
    assert len(set(exported)) == len(exported), "a name is listed twice"
    missing = [name for name in exported if not hasattr(module, name)]
    assert not missing, f"ddpjob_worker.{module_name}.__all__ names what it lacks: {missing}"


@pytest.mark.parametrize("module_name", USER_MODULES)
def test_a_user_module_documents_its_arguments_and_results(module_name: str) -> None:
    assert problems_of(module_name) == []


def test_the_check_finds_an_undocumented_argument() -> None:
    """The check above proves something only if it fails where a section is missing."""

    @dataclasses.dataclass
    class Record:
        """A record."""

        documented: int
        """Has its line."""
        bare: int

        def scale(self, factor: int) -> int:
            """Multiply."""
            return self.documented * factor

    assert _undocumented_fields(Record) == ["bare"]
    signature = inspect.signature(Record.scale)
    assert list(_problems("Record.scale", Record.scale, signature, method=True)) == [
        "Record.scale: takes arguments, but its docstring has no Args: section",
        "Record.scale: returns int, but its docstring has no Returns: section"]
