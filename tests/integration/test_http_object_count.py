"""A JSON infer body of many empty objects is refused (400) from its raw bytes, with what to raise."""

from __future__ import annotations

import httpx

from tests.support.repos import ADD_SUB


async def test_a_body_of_empty_objects_is_refused_before_it_is_parsed(http: httpx.AsyncClient) -> None:
    body = b'{"inputs":[' + b"{}," * 99_999 + b"{}]}"
    resp = await http.post(f"/v2/models/{ADD_SUB}/infer", content=body)
    assert resp.status_code == 400
    assert resp.json()["error"].startswith(f"request for model '{ADD_SUB}' holds 100001 JSON objects, more than")
