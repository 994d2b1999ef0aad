"""Print charts/ddpjob-operator/README.md: how to install, then the values table generated from values.schema.json
(every key, its type and constraints) with each value's default from values.yaml and the comment above it there.

`make chart-readme` writes it; tests/unit/test_chart.py fails when it is stale. Usage: chart_readme.py CHART_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import yaml

HEAD = """\
# ddpjob-operator

The Helm chart of [ddpjob](https://github.com/ddpjob/ddpjob): a Kubernetes operator that makes PyTorch
DistributedDataParallel training (the `DDPJob` resource) survive failures. Chart {version}, operator {app}.
Needs Kubernetes {kube} (Chart.yaml's kubeVersion; docs/packaging.md, "Compatibility").

```bash
helm install ddpjob-operator oci://<registry>/charts/ddpjob-operator --version {version} \\
  --namespace ddpjob-system --create-namespace --set imageRegistry=<registry>     # where `make images push` put them
kubectl -n ddpjob-system rollout status deployment/ddpjob-operator
```

The CRD is part of the release: `helm upgrade` upgrades it, `helm uninstall` keeps it (deleting it would delete every
DDPJob). Upgrading from chart 0.3.0 or older: add `--take-ownership` once (docs/lifecycle.md, "Upgrade").

## Values

Generated from `values.schema.json` and the comments in `values.yaml` by `make chart-readme`; unknown keys fail the
install.

| key | type | default | description |
| --- | --- | --- | --- |
"""


def comments(lines: list[str]) -> dict[str, str]:
    """Each key path of values.yaml -> the comment lines right above it, joined."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.startswith("- ") or ":" not in stripped:
            continue
        indent = len(line) - len(line.lstrip())
        key = stripped.split(":", 1)[0]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        stack.append((indent, key))
        above: list[str] = []
        j = i - 1
        while j >= 0 and lines[j].strip().startswith("#"):
            above.insert(0, lines[j].strip().lstrip("#").strip())
            j -= 1
        out[path] = " ".join(above)
    return out


def kind(node: dict[str, Any]) -> str:
    """The schema's type with its constraints, short: `integer 1..65535`, ``one of `Always`, `IfNotPresent` ``."""
    if "enum" in node:
        return "one of " + ", ".join(f"`{v}`" for v in node["enum"])
    text = node.get("type", "any")
    text = " or ".join(text) if isinstance(text, list) else text
    low, high = node.get("minimum", node.get("exclusiveMinimum")), node.get("maximum")
    if low is not None or high is not None:
        text += f" {'' if low is None else low}..{'' if high is None else high}"
    if "pattern" in node:
        text += f" matching `{node['pattern']}`"
    return text


def default(values: dict[str, Any], path: str) -> str:
    node: Any = values
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "`" + json.dumps(node) + "`"


def rows(schema: dict[str, Any], values: dict[str, Any], notes: dict[str, str], prefix: str = "") -> list[str]:
    out = []
    for key, node in schema.get("properties", {}).items():
        path = prefix + key
        if "properties" in node:  # an object whose keys the schema names: a row per key
            out += rows(node, values, notes, path + ".")
            continue
        cells = (f"`{path}`", kind(node), default(values, path), notes.get(path, ""))
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")  # GitHub splits on | in code too
    return out


def main(chart: Path) -> str:
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    schema = json.loads((chart / "values.schema.json").read_text())
    text = (chart / "values.yaml").read_text()
    body = rows(schema, yaml.safe_load(text), comments(text.splitlines()))
    head = HEAD.format(version=meta["version"], app=meta["appVersion"], kube=meta["kubeVersion"])
    return head + "\n".join(body) + "\n"


if __name__ == "__main__":
    sys.stdout.write(main(Path(sys.argv[1])))
