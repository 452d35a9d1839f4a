"""Tokens from files for the engine integrations (token_file): the first
line, trimmed; refused when its group or others may read it, when empty,
missing, or given with token."""

from __future__ import annotations

import os
import pathlib

import pytest

from kvtier import token_of


def test_token_file(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "token"
    f.write_text("  acme-token-0123456789  \nignored\n")
    os.chmod(f, 0o600)
    assert token_of(None, str(f), "t") == "acme-token-0123456789"
    assert token_of("inline-token-0123456", None, "t") == "inline-token-0123456"
    assert token_of(None, None, "t") is None
    with pytest.raises(ValueError, match="not both"):
        token_of("x", str(f), "t")
    os.chmod(f, 0o640)
    with pytest.raises(ValueError, match="chmod 600"):
        token_of(None, str(f), "t")
    e = tmp_path / "empty"
    e.write_text("\n")
    os.chmod(e, 0o600)
    with pytest.raises(ValueError, match="is empty"):
        token_of(None, str(e), "t")
    with pytest.raises(ValueError, match="No such file"):
        token_of(None, str(tmp_path / "absent"), "t")
