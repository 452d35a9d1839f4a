"""The Python client against a daemon whose TCP API serves mutual TLS:
with the CA and a client certificate it works; without the certificate,
without TLS or with another CA the call fails and tls_trouble names why."""

from __future__ import annotations

import datetime
import ipaddress
import pathlib
import socket
import tempfile

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import kvtier
from conftest import Daemon


def pki(d: pathlib.Path, tag: str) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate,
    as PEM files in d."""
    now = datetime.datetime.now(datetime.timezone.utc)
    out: dict[str, str] = {}

    def write(name: str, data: bytes) -> str:
        p = d / f"{tag}-{name}.pem"
        p.write_bytes(data)
        return str(p)

    def key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def pem_key(k: ec.EllipticCurvePrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kvtier test CA {tag}")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    out["ca"] = write("ca", ca.public_bytes(serialization.Encoding.PEM))
    for i, (name, usage) in enumerate([("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)]):
        k = key()
        cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                .issuer_name(ca_name).public_key(k.public_key()).serial_number(10 + i)
                .not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([usage]), critical=False).sign(ca_key, hashes.SHA256()))
        out[name + "_cert"] = write(name + "-cert", cert.public_bytes(serialization.Encoding.PEM))
        out[name + "_key"] = write(name + "-key", pem_key(k))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def tls_daemon(kvtier_bin: str):  # type: ignore[no-untyped-def]
    d = pathlib.Path(tempfile.mkdtemp(prefix="kvtls"))
    p = pki(d, "a")
    addr = f"127.0.0.1:{free_port()}"
    dm = Daemon(kvtier_bin, d, f"""
namespace: {{model: tls, bytes_per_block: 4KiB}}
primary: {{bytes: 1MiB, arena: {{kind: anonymous}}}}
server:
  unix_socket: ""
  tcp_addr: {addr}
  metrics_addr: ""
  tls: {{cert_file: {p['server_cert']}, key_file: {p['server_key']}, client_ca_file: {p['ca']}}}
""").start()
    yield dm, addr, p, pki(d, "other")
    dm.stop()


def test_mutual_tls(tls_daemon) -> None:  # type: ignore[no-untyped-def]
    _, addr, p, other = tls_daemon
    with kvtier.Client(addr, tls_ca=p["ca"], tls_cert=p["client_cert"], tls_key=p["client_key"]) as c:
        assert c.stats().primary.num_slots > 0
    for what, kw, want in [
        ("no client certificate", {"tls_ca": p["ca"]}, "client certificate"),
        ("another CA", {"tls_ca": other["ca"], "tls_cert": p["client_cert"], "tls_key": p["client_key"]}, "not signed by a CA"),
        ("plaintext", {}, None),
    ]:
        with kvtier.Client(addr, **kw) as c:
            with pytest.raises(grpc.RpcError) as ei:
                c.stats()
            assert ei.value.code() == grpc.StatusCode.UNAVAILABLE, what
            if want is not None:
                why = kvtier.tls_trouble(ei.value)
                assert why is not None and want in why, (what, why, ei.value.details())


def test_tls_options_are_checked() -> None:
    with pytest.raises(ValueError, match="Unix socket"):
        kvtier.Client("./kvtier.sock", tls_ca="ca.pem")
    with pytest.raises(ValueError, match="go together"):
        kvtier.Client("127.0.0.1:1", tls_cert="c.pem")
    with pytest.raises(ValueError, match="tls_ca /nonexistent"):
        kvtier.Client("127.0.0.1:1", tls_ca="/nonexistent/ca.pem")
