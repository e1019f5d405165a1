"""Write the HTTP API's OpenAPI document to docs/openapi.json (``python scripts/openapi.py``).

``tests/api/test_openapi.py`` fails when the checked-in document is not what the code makes,
so a change to the API is a change to this file in the same commit.
"""

from __future__ import annotations

import json
from pathlib import Path

from flowx.api.app import openapi_document

TARGET = Path(__file__).resolve().parents[1] / "docs" / "openapi.json"

if __name__ == "__main__":
    TARGET.write_text(json.dumps(openapi_document(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {TARGET}")
