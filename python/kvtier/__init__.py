"""kvtier: Python client of the kvtier daemon (see client.py)."""

from kvtier.client import (  # noqa: F401
    HIT,
    HIT_PENDING,
    MISS,
    NOT_LOOKED_UP,
    RETRY,
    Arena,
    Client,
    make_key,
    receive_arena_fd,
    rpc_message,
    tls_credentials,
    tls_trouble,
    token_of,
)
