"""The API's OpenAPI 3.1 description, built from the endpoint table itself, so the
description cannot drift from what is served."""

from __future__ import annotations

import re
from typing import Any

from charter import __version__
from charter.server import remote
from charter.server.api import ENDPOINTS, PREFIX, VERSION

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
            "additionalProperties": True,
        }
    },
}

_REFUSALS = {
    "400": "malformed request (code usage_error, contract_error)",
    "401": "no valid credential (code unauthenticated); audited",
    "403": "the engine refused the right (code not_authorized); audited",
    "404": "no such mission, run, attempt, approval or incident (code not_found)",
    "409": "the request does not fit the recorded state (code invalid_state and its kinds)",
}


def _schema(kind: str) -> dict[str, Any]:
    """A body field's schema; ``any``: whatever JSON value (a request, a result)."""
    return {} if kind == "any" else {"type": kind}


def document() -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for ep in (*ENDPOINTS, *remote.ENDPOINTS):
        params = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
            for n in re.findall(r"{(\w+)}", ep.path)
        ] + [{"name": n, "in": "query", "schema": {"type": "string"}} for n in ep.query]
        op: dict[str, Any] = {
            "operationId": ep.name,
            "summary": ep.summary,
            "description": (
                "Needs a valid credential."
                if ep.needs == "credential"
                else f"The engine checks the {ep.needs!r} right under the mission's "
                "current contract and audits the decision, refusals included."
            ),
            "parameters": params,
            "responses": {
                "200": {"description": "done", "content": {"application/json": {}}},
                **{
                    code: {
                        "description": text,
                        "content": {"application/json": {"schema": {"$ref": "#/$defs/Error"}}},
                    }
                    for code, text in _REFUSALS.items()
                },
            },
        }
        if ep.body:
            op["requestBody"] = {
                "content": {
                    "application/json": {
                        "schema": {
                            "type": "object",
                            "properties": {k: _schema(t) for k, t in ep.body.items()},
                            "required": list(ep.required),
                            "additionalProperties": False,
                        }
                    }
                }
            }
        paths.setdefault(PREFIX + ep.path, {})[ep.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "Charter API", "version": f"{VERSION} (charter {__version__})"},
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "a principal's credential, NAME:SECRET",
                }
            }
        },
        "$defs": {"Error": _ERROR},
        "paths": paths,
    }
