"""The CRD stays in step with spec.py: same defaults, the subresources and columns users rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ddpjob_operator.api.spec import DDPJobSpec

CRD = Path(__file__).resolve().parents[3] / "operator" / "ddpjob_operator" / "crd" / "ddpjob-crd.yaml"


def version() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    v: dict[str, Any] = crd["spec"]["versions"][0]
    return v


def crd_defaults(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, prop in (schema.get("properties") or {}).items():
        if "default" in prop:
            out[name] = prop["default"]
        nested = crd_defaults(prop)
        if nested:
            out[name] = {**(out.get(name) or {}), **nested}
    return out


def test_defaults_match_spec_model() -> None:
    spec_schema = version()["schema"]["openAPIV3Schema"]["properties"]["spec"]
    defaults = crd_defaults(spec_schema)
    defaults.pop("checkpoint")["volumeClaim"]  # only applies when volumeClaim is given
    model = DDPJobSpec.model_validate(
        {"replicas": 1, "template": {"spec": {"containers": [{"image": "x", "command": ["python", "t.py"]}]}}}
    ).model_dump(by_alias=True)
    assert defaults["nprocPerNode"] == model["nprocPerNode"]
    assert defaults["maxRestarts"] == model["maxRestarts"]
    for section in ("rendezvous", "runPolicy", "runtime"):
        for key, value in defaults[section].items():
            assert model[section][key] == value, f"{section}.{key}"
    ckpt = crd_defaults(spec_schema)["checkpoint"]
    for key in ("mountPath", "retainOnDelete", "keep"):
        assert model["checkpoint"][key] == ckpt[key], key
    vc = ckpt["volumeClaim"]
    assert vc["size"] == "10Gi" and vc["accessModes"] == ["ReadWriteOnce"]


def test_subresources_columns_and_names() -> None:
    v = version()
    assert v["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    columns = [c["name"] for c in v["additionalPrinterColumns"]]
    assert columns == ["State", "Ready", "Incidents", "Recovery", "Restarts", "Epoch", "Step", "Steps/s", "Checkpoint",
                       "Age"]
    names = yaml.safe_load(CRD.read_text())["spec"]["names"]
    assert names["shortNames"] == ["ddpj"] and names["categories"] == ["ddp"]


#: Every keyword a structural CRD schema node may carry. A stray key means a YAML slip, e.g. an unquoted comma in a
#: flow mapping that turns half a description into a key: the API server prunes it, so every apply "configures".
SCHEMA_KEYWORDS = {
    "type", "format", "description", "properties", "items", "required", "default", "enum", "pattern", "minimum",
    "maximum", "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "nullable",
    "additionalProperties",
    "x-kubernetes-preserve-unknown-fields", "x-kubernetes-int-or-string", "x-kubernetes-validations",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type", "x-kubernetes-embedded-resource",
}


def test_every_schema_node_uses_only_openapi_keywords() -> None:
    def walk(node: dict[str, Any], path: str) -> list[str]:
        bad = [f"{path}: {k!r}" for k in node if k not in SCHEMA_KEYWORDS]
        for name, child in (node.get("properties") or {}).items():
            bad += walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            bad += walk(node["items"], f"{path}[]")
        return bad

    bad = walk(version()["schema"]["openAPIV3Schema"], "")
    assert not bad, f"not OpenAPI schema keywords: {bad}"


def pruned(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The paths of ``obj`` that the API server's structural pruning would drop under ``schema``. The
    preserve-unknown-fields flag keeps unknown keys of its own node only: a nested node with properties of its own
    is pruned by them."""
    if isinstance(obj, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        keep = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
        if props is None and isinstance(extra, dict):
            return [p for k, v in obj.items() for p in pruned(v, extra, f"{path}.{k}")]
        props = props or {}
        return [p for k, v in obj.items()
                for p in (pruned(v, props[k], f"{path}.{k}") if k in props else [] if keep else [f"{path}.{k}"])]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in pruned(v, schema.get("items") or {}, f"{path}[{i}]")]
    return []


def status_schema() -> dict[str, Any]:
    schema: dict[str, Any] = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def test_pruned_finds_a_field_the_schema_lacks() -> None:
    """The check below must be able to fail."""
    assert pruned({"incidents": [{"id": 1, "nope": 2}]}, status_schema()) == [".incidents[0].nope"]


def unbounded(node: dict[str, Any], path: str) -> list[str]:
    """The places under ``node`` whose size the schema leaves open: a string without maxLength (or an enum), a map
    or an object that keeps unknown fields without maxProperties, a list without maxItems."""
    found = []
    kind = node.get("type")
    if kind == "string" and "maxLength" not in node and "enum" not in node:
        found.append(path)
    if kind == "object" and ("additionalProperties" in node or node.get("x-kubernetes-preserve-unknown-fields")) \
            and "maxProperties" not in node:
        found.append(path)
    if kind == "array" and "maxItems" not in node:
        found.append(path)
    for name, sub in (node.get("properties") or {}).items():
        found += unbounded(sub, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        found += unbounded(node["additionalProperties"], f"{path}.*")
    if isinstance(node.get("items"), dict):
        found += unbounded(node["items"], f"{path}[]")
    return found


def test_status_progress_is_bounded_in_size() -> None:
    """Worker pods write status.progress (issue 43 #11): the API server refuses one of unbounded size."""
    status = version()["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert unbounded(status["properties"]["progress"], "status.progress") == []
    peers = status["properties"]["progress"]["properties"]["lostPeers"]
    assert peers["maxProperties"] >= 10000 + 16, "one entry per pod of the largest job (replicas + spares)"
