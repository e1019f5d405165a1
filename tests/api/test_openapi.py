"""``docs/openapi.json`` is what the code makes (``python scripts/openapi.py`` rewrites it), so
the document a client generates from is never behind the API."""

from __future__ import annotations

import json
from pathlib import Path

from flowx.api.app import openapi_document

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"


def test_the_checked_in_openapi_document_is_current() -> None:
    made = json.loads(json.dumps(openapi_document(), sort_keys=True))
    assert json.loads(DOC.read_text()) == made, (
        "docs/openapi.json is stale: run `python scripts/openapi.py` and commit it"
    )


def test_every_operation_documents_its_errors_and_the_bearer_scheme() -> None:
    doc = json.loads(DOC.read_text())
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            statuses = set(operation["responses"])
            assert {"422", "503"} <= statuses, f"{method} {path}: {sorted(statuses)}"
            if path.startswith("/v1/"):
                assert {"401", "403"} <= statuses and operation.get("security"), path
