"""Helpers for the tests of a running service: empty its store, read what it holds.

Both go through the test routes `serve --allow-reset` serves, as an operator.
"""

from __future__ import annotations

from typing import Any

import httpx

from support import KEY_ID, SECRET
from workwarden.service.testing import RunningService


def reset(service: RunningService) -> RunningService:
    """`service` with an empty store, verifying the fixture key's grants."""
    reply = httpx.post(
        service.url + "/v1/test/reset",
        json={"store": [], "grant_keys": {KEY_ID: SECRET.hex()}},
        headers={"Authorization": "Bearer " + service.token("operator")},
    )
    assert reply.status_code == 200, reply.text
    return service


def stored(service: RunningService) -> Any:
    """Every document the service's store holds (`/v1/test/store`)."""
    reply = httpx.get(
        service.url + "/v1/test/store",
        headers={"Authorization": "Bearer " + service.token("operator")},
    )
    assert reply.status_code == 200
    return reply.json()
