"""TLS: the node's HTTPS server options and how its clients verify peers.

A node serves HTTPS when it has a certificate and its key (``--tls-cert``, ``--tls-key``): uvicorn does the TLS,
this module checks the pair first so that a wrong file is a SettingsError naming the flag, not a traceback
from inside the server. A node verifies its peers' certificates against ``--tls-ca`` (a PEM bundle; without
it, the system's store), for forwarded sub-requests and health checks alike.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from iqgraph.app.settings import Settings, SettingsError

_CERTIFICATE = "-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = "PRIVATE KEY-----"  # PKCS#8 ("BEGIN PRIVATE KEY"), PKCS#1 ("BEGIN RSA …"), SEC1 ("BEGIN EC …")


def server_options(settings: Settings) -> dict[str, Any]:
    """Return uvicorn's options to serve HTTPS with the settings' certificate and key ({} for plain HTTP).

    Raises:
        SettingsError: a file is missing or unreadable, is not PEM, the key is encrypted or is not the
            certificate's.
    """
    if settings.tls_cert is None or settings.tls_key is None:
        return {}
    check_key_pair(settings.tls_cert, settings.tls_key)
    return {"ssl_certfile": str(settings.tls_cert), "ssl_keyfile": str(settings.tls_key)}


def check_key_pair(cert: Path, key: Path) -> None:
    """Raise SettingsError unless cert is a PEM certificate chain and key its unencrypted PEM private key."""
    _read_pem(cert, _CERTIFICATE, "--tls-cert", "a PEM certificate chain (the node's certificate first)")
    _read_pem(key, _PRIVATE_KEY, "--tls-key", "an unencrypted PEM private key")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=_encrypted(key))
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise SettingsError(f"--tls-key {key} is not the private key of --tls-cert {cert}") from None
        raise SettingsError(f"--tls-cert {cert} and --tls-key {key} cannot be loaded: {exc}") from None


def peer_verify(settings: Settings) -> ssl.SSLContext | bool:
    """Return how the node's HTTP clients verify peers' certificates (httpx's ``verify``).

    True (the system's CA store) without ``tls_ca``; else a context trusting that bundle only, one per file.
    """
    return True if settings.tls_ca is None else _ca_context(settings.tls_ca)


@functools.cache
def _ca_context(ca: Path) -> ssl.SSLContext:
    _read_pem(ca, _CERTIFICATE, "--tls-ca", "a PEM bundle of the CA certificates that sign the peers' certificates")
    try:
        return ssl.create_default_context(cafile=ca)
    except ssl.SSLError as exc:
        raise SettingsError(f"--tls-ca {ca} cannot be loaded as CA certificates: {exc}") from None


def _read_pem(path: Path, marker: str, flag: str, wanted: str) -> None:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise SettingsError(f"{flag} {path}: {exc.strerror or exc}; give {wanted}") from None
    if marker not in text:
        raise SettingsError(f"{flag} {path} is not {wanted}")


def _encrypted(key: Path) -> Callable[[], NoReturn]:
    def refuse() -> NoReturn:  # called by OpenSSL only for an encrypted key: never prompt on the terminal
        raise SettingsError(f"--tls-key {key} is encrypted; give the key unencrypted (readable by the node only)")

    return refuse
