"""Every invalid manifest under tests/integration/invalid is also rejected by parse_ddpjob (the local runner has
no API server); those the API server accepts must give the operator's InvalidSpec message they promise."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from ddpjob_operator.spec import InvalidSpec, parse_ddpjob

INVALID = Path(__file__).resolve().parents[2] / "integration" / "invalid"
FILES = sorted(INVALID.glob("*.yaml"))


def header(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if not line.startswith("# "):
            break
        key, _, value = line[2:].partition(": ")
        out[key] = value
    return out


def test_there_are_at_least_15() -> None:
    assert len(FILES) >= 15


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_parse_ddpjob_rejects(path: Path) -> None:
    meta = header(path)
    assert meta.get("expect") and meta.get("rejected-by") in ("api-server", "operator"), f"{path.name}: bad header"
    with pytest.raises(InvalidSpec) as err:
        parse_ddpjob(yaml.safe_load(path.read_text()))
    if meta["rejected-by"] == "operator":
        assert meta["expect"] in str(err.value)
