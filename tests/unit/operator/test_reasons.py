"""Every reason the operator writes into a condition or an Event is a named constant of api/reasons.py (issue 41),
written nowhere else as a literal: a wire string users match on is defined once (docs/api.md's "Reasons" table,
tests/unit/test_docs.py, lists the same constants)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from ddpjob_operator.api import reasons

pytestmark = pytest.mark.unit

OPERATOR = Path(reasons.__file__).resolve().parents[1]
REASONS_PY = Path(reasons.__file__).resolve()
CONSTANTS = {name: value for name, value in vars(reasons).items() if name.isupper() and isinstance(value, str)}
VALUES = {value: name for name, value in CONSTANTS.items()}
CAMEL = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*$")

#: The same word in another role, where Kubernetes or Kueue use it (module under ddpjob_operator/, word): what it is
#: there. A reason passed as one is still found (the call and assignment checks below).
OTHER_ROLES = {
    ("planner/observation.py", reasons.PENDING): "a pod's phase",
    ("planner/kueue/gate.py", reasons.EVICTED): "a type of Kueue's Workload conditions",
    ("planner/kueue/workload.py", reasons.EVICTED): "a type of Kueue's Workload conditions",
    ("planner/kueue/gate.py", reasons.ADMITTED): "a type of Kueue's Workload conditions",
    ("planner/kueue/workload.py", reasons.ADMITTED): "a type of Kueue's Workload conditions",
    ("planner/kueue/admission.py", reasons.ADMITTED): "a type of Kueue's Workload conditions",
}

#: Calls that take a condition's or an Event's reason, and its position when it is passed positionally (any call's
#: ``reason=`` keyword is checked too).
REASON_ARG = {"Outcome": None, "Aux": 2, "Event": 1, "Gate": 1, "Problem": 3, "_condition": 2, "set_condition": 3,
              "put": 2, "clear": 1, "Stall": 0, "Verdict": 2, "Queued": 1, "CannotStart": 1, "_fail": 2, "_held": 2}


def _documentation(tree: ast.AST) -> set[int]:
    """The string statements (docstrings, attribute docstrings): prose, not code."""
    return {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)}


def _callee(call: ast.Call) -> str | None:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _reason_expressions(node: ast.AST) -> list[ast.expr]:
    """What ``node`` passes or assigns as a reason: a call's reason argument, ``reason = ...`` (tuple targets
    aligned), a dict's ``"reason"`` value."""
    if isinstance(node, ast.Call):
        found = [kw.value for kw in node.keywords if kw.arg == "reason"]
        name = _callee(node)
        pos = REASON_ARG.get(name) if name is not None else None
        return found + ([node.args[pos]] if pos is not None and len(node.args) > pos else [])
    if isinstance(node, ast.Assign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        out: list[ast.expr] = []
        for target in targets:
            if isinstance(target, ast.Name) and target.id == "reason" and node.value is not None:
                out.append(node.value)
            elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                out += [v for t, v in zip(target.elts, node.value.elts, strict=False)
                        if isinstance(t, ast.Name) and t.id == "reason"]
        return out
    if isinstance(node, ast.Dict):
        return [v for k, v in zip(node.keys, node.values, strict=True)
                if isinstance(k, ast.Constant) and k.value == "reason"]
    return []


def _outcomes(expr: ast.expr) -> list[ast.expr]:
    """The values ``expr`` may come to: both arms of ``a if c else b``, each operand of ``a or b`` (not ``c``)."""
    if isinstance(expr, ast.IfExp):
        return _outcomes(expr.body) + _outcomes(expr.orelse)
    if isinstance(expr, ast.BoolOp):
        return [v for value in expr.values for v in _outcomes(value)]
    return [expr]


def inline_reasons(source: str, module: str) -> list[str]:
    """Where ``source`` (module ``module``, relative to ddpjob_operator/) writes a reason as a literal: a string equal
    to a constant's value anywhere in its code, or a CamelCase string passed or assigned as a reason."""
    tree = ast.parse(source)
    prose = _documentation(tree)
    found: dict[tuple[int, str], str] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
                and node.value in VALUES and (module, node.value) not in OTHER_ROLES):
            found[node.lineno, node.value] = f"use reasons.{VALUES[node.value]}"
        for expr in _reason_expressions(node):
            for const in _outcomes(expr):
                if isinstance(const, ast.Constant) and isinstance(const.value, str) and CAMEL.match(const.value):
                    found.setdefault((const.lineno, const.value), "a reason literal: define it in api/reasons.py")
    return [f"{module}:{line}: {value!r}: {what}" for (line, value), what in sorted(found.items())]


def test_no_module_writes_a_reason_inline() -> None:
    found = [hit for path in sorted(OPERATOR.rglob("*.py")) if path != REASONS_PY
             for hit in inline_reasons(path.read_text(encoding="utf-8"), path.relative_to(OPERATOR).as_posix())]
    assert not found, "reasons written inline:\n" + "\n".join(found)


@pytest.mark.parametrize(("source", "word"), [
    pytest.param('st.Outcome(state=st.FAILED, reason="DeadlineExceeded", message="m")\n', "DeadlineExceeded",
                 id="a-constants-value-as-keyword"),
    pytest.param('QUIET = ("Progressing", "StartingUp")\n', "Progressing", id="a-constants-value-anywhere"),
    pytest.param('st.Aux(st.STALLED, True, "NewReason", "m")\n', "NewReason", id="a-new-reason-positional"),
    pytest.param('st.Event("Warning", "SomethingBroke", "m")\n', "SomethingBroke", id="a-new-event-reason"),
    pytest.param('Gate(False, x or "Waiting", "m")\n', "Waiting", id="a-fallback-reason"),
    pytest.param('reason, hint = "QuotaGone", "raise it"\n', "QuotaGone", id="an-assigned-reason"),
    pytest.param('cond = {"type": "X", "reason": "Fine"}\n', "Fine", id="a-dict-reason"),
    pytest.param('p = observed.phase == "Pending"\n', "Pending", id="another-roles-word-elsewhere"),
])
def test_a_planted_literal_is_found(source: str, word: str) -> None:
    found = inline_reasons(source, "planner/plan.py")
    assert found and repr(word) in found[0]


@pytest.mark.parametrize(("source", "module"), [
    pytest.param('"""The job is WorkersSucceeded when ..."""\nx = 1\n', "planner/plan.py", id="docstring"),
    pytest.param("# reason AllWorkersRunning\nx = 1\n", "planner/plan.py", id="comment"),
    pytest.param('phase = status.get("phase") or "Pending"\n', "planner/observation.py", id="a-pod-phase"),
    pytest.param('st.Event("Warning", reasons.WORKER_FAILED, f"lost (Stalled): {x}")\n', "planner/plan.py",
                 id="the-constant-and-a-message"),
    pytest.param('d = DeletePod(pod.name, pod.uid, True, "ScaledDown")\n', "planner/plan.py", id="a-log-word"),
    pytest.param('reason = reasons.X if err.kind == "Pod" else reasons.Y\n', "planner/plan.py", id="a-test-of-a-kind"),
])
def test_what_is_not_a_reason_literal(source: str, module: str) -> None:
    assert inline_reasons(source, module) == []


def test_the_constants_are_named_by_their_word_and_documented() -> None:
    """``WORKERS_SUCCEEDED = "WorkersSucceeded"``, one value each, each with a ``#:`` comment saying when."""
    assert len(CONSTANTS) == len(VALUES), "two constants share a word"
    for name, value in CONSTANTS.items():
        assert CAMEL.match(value), value
        assert re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", value).upper() == name
    lines = REASONS_PY.read_text(encoding="utf-8").splitlines()
    undocumented = [line for i, line in enumerate(lines) if re.match(r"^[A-Z_]+ = ", line)
                    and not lines[i - 1].startswith("#:")]
    assert not undocumented


def test_every_constant_is_used_by_the_operator() -> None:
    """No stale reason (the docs' table lists every constant)."""
    code = "\n".join(p.read_text(encoding="utf-8") for p in OPERATOR.rglob("*.py") if p != REASONS_PY)
    unused = [name for name in CONSTANTS if not re.search(rf"\b{name}\b", code)]
    assert not unused
