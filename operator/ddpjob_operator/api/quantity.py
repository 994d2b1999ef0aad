"""Kubernetes resource quantities (``1.5Gi``, ``250m``, ``2``) as numbers, and checks of a ``resources`` block.

The operator image has no kubernetes client, whose parser this matches (tests/unit/operator/test_gang.py). The API
server checks the quantities of the pods it is given, but a DDPJob's pod template is free-form in the CRD: a bad
quantity there would reach the planner (the gang's minResources) and the pod create, so the spec checks it first."""

from __future__ import annotations

import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation

_SUFFIX: dict[str, int | Decimal] = {
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
    "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "": 1,
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|)$")


def parse_quantity(value: object) -> Decimal:
    """A Kubernetes quantity as a number; ValueError naming the value when it is none."""
    match = _QUANTITY.match(str(value).strip())
    try:
        if match is None:
            raise InvalidOperation
        return Decimal(match[1]) * Decimal(str(_SUFFIX[match[2]]))
    except InvalidOperation:
        raise ValueError(f"{value!r} is not a Kubernetes quantity") from None


def resources_error(resources: object) -> str | None:
    """What is wrong with a container's ``resources`` (``requests``/``limits`` of quantities, no request above its
    limit), as ``<path>: <message>`` relative to the block; None when it is valid."""
    if resources is None:
        return None
    if not isinstance(resources, Mapping):
        return ": must be an object with requests and limits"
    amounts: dict[str, dict[str, Decimal]] = {}
    for part in ("requests", "limits"):
        block = resources.get(part)
        if block is None:
            continue
        if not isinstance(block, Mapping):
            return f".{part}: must map resource names to quantities such as 500m or 1Gi"
        for name, value in block.items():
            try:
                if isinstance(value, bool) or not isinstance(value, str | int | float):
                    raise ValueError(value)  # str() of a list or a bool could pass the pattern
                amount = parse_quantity(value)
            except ValueError:
                return f".{part}.{name}: {value!r} is not a quantity; write it like 500m, 2 or 1Gi"
            if amount < 0:
                return f".{part}.{name}: {value!r} is negative"
            amounts.setdefault(part, {})[str(name)] = amount
    for name, request in amounts.get("requests", {}).items():
        limit = amounts.get("limits", {}).get(name)
        if limit is not None and request > limit:
            return f".requests.{name}: {resources['requests'][name]!r} is above its limit " \
                   f"{resources['limits'][name]!r}; raise the limit or lower the request"
    return None
