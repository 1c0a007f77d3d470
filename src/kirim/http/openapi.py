"""The OpenAPI document of the HTTP API, kept in the repository as ``openapi.json``.

    python -m kirim.http.openapi          # rewrite src/kirim/http/openapi.json
    python -m kirim.http.openapi --check  # exit 1 when it differs from the code's

The served ``/openapi.json`` is generated from the routes; a test checks that it
equals the file, so that a change to the API is a change to the file too.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

STORED = Path(__file__).with_name("openapi.json")


def document() -> dict[str, Any]:
    """The document the service serves (independent of configuration)."""
    from kirim.config import Config
    from kirim.engine import Kirim
    from kirim.http.app import create_app

    app = create_app(Kirim(Config(database="sqlite:///openapi-unused.db")))
    return app.openapi()


def render(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False) + "\n"


def stored() -> dict[str, Any]:
    """The document kept with the package."""
    text = resources.files("kirim.http").joinpath("openapi.json").read_text(encoding="utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = render(document())
    if "--check" in args:
        if STORED.read_text(encoding="utf-8") != text:
            print(f"{STORED} is out of date: run python -m kirim.http.openapi", file=sys.stderr)
            return 1
        return 0
    STORED.write_text(text, encoding="utf-8")
    print(f"wrote {STORED}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
