"""Which files of manifests/examples/ the e2e tier applies, and with what (issue 44 #8): tests/e2e/test_examples.py
runs them; tests/unit/test_examples.py checks that every file is here, in tests/e2e/test_install.py, or says in its
first line why the tier cannot apply it."""

from __future__ import annotations

from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "manifests" / "examples"
#: file -> (the DDPJob it holds, the files applied before it in the same namespace)
APPLIED: dict[str, tuple[str, list[str]]] = {
    "elastic.yaml": ("charlm-elastic", []),
    "existing-pvc.yaml": ("charlm-reuse", []),
    "hf-trainer.yaml": ("hf-trainer", []),
    "kueue/job.yaml": ("charlm-queued", ["kueue/kueue-rbac.yaml", "kueue/queues.yaml"]),
}
#: Applied by tests/e2e/test_install.py (in `make e2e`, CI).
BY_TEST_INSTALL = {"cpu-charlm.yaml"}
