"""The CRD stays in step with spec.py: same defaults, the subresources and columns users rely on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from ddpjob_operator.spec import DDPJobSpec

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
        {"replicas": 1, "template": {"spec": {"containers": [{"image": "x"}]}}}
    ).model_dump(by_alias=True)
    assert defaults["nprocPerNode"] == model["nprocPerNode"]
    assert defaults["maxRestarts"] == model["maxRestarts"]
    for section in ("rendezvous", "runPolicy"):
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
    assert columns == ["State", "Ready", "Incidents", "Restarts", "Epoch", "Step", "Checkpoint", "Age"]
    names = yaml.safe_load(CRD.read_text())["spec"]["names"]
    assert names["shortNames"] == ["ddpj"] and names["categories"] == ["ddp"]
