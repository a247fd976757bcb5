"""Request and response ids keep uuid4's shapes."""

from __future__ import annotations

import uuid

from server.core.ids import random_hex, random_uuid


def test_a_hex_id_is_32_hex_digits_and_new_each_time() -> None:
    ids = {random_hex() for _ in range(1000)}
    assert len(ids) == 1000 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


def test_a_uuid_id_is_a_version_4_uuid() -> None:
    parsed = uuid.UUID(random_uuid())
    assert parsed.version == 4 and str(parsed) != random_uuid()
