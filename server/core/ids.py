"""Request and response ids: 128 bits from a generator seeded once from the OS.

`uuid.uuid4()` asks the OS for every id (`os.urandom`), and that call lets go of the GIL: on the event
loop, with the executor's threads tokenizing, getting it back waited behind them (with 3 busy threads,
1.09 ms a call against 2 us alone, on 2 cores of an AMD Zen 4), twice a request. The ids here need to
be unique, not unguessable (nothing is authorised by knowing one); batch and file ids keep uuid4.
"""

from __future__ import annotations

import random
import uuid

_bits = random.Random()  # seeded from os.urandom; getrandbits holds the GIL: one thread at a time


def random_hex() -> str:
    """32 hex digits, as uuid4().hex."""
    return f"{_bits.getrandbits(128):032x}"


def random_uuid() -> str:
    """A version-4 UUID's text, as str(uuid4())."""
    return str(uuid.UUID(int=_bits.getrandbits(128), version=4))
