"""How every rayft client reaches the service: TLS, or plaintext on loopback only.

The CLI and the Python client (team calls) and the job on the cluster (its claim and reports) open
their channels here, so one rule holds everywhere: a bearer token never crosses a network in clear.

    TlsConfig.from_env()        # RAYFT_TLS_CA, RAYFT_TLS (1: the system's roots), RAYFT_TLS_CERT and
                                # RAYFT_TLS_KEY (a client certificate, for a service that asks for one),
                                # RAYFT_TLS_SERVER_NAME (the name the certificate carries, if not the host's)
    channel(address, tls)       # grpc.Channel; aio=True for grpc.aio
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc

from rayft_contract.spec import SpecError


class PlaintextRefused(SpecError):
    """A plaintext channel to a host that is not this machine: it would carry a token in clear."""


@dataclasses.dataclass(frozen=True)
class TlsConfig:
    enabled: bool = False
    ca: bytes | None = None
    """PEM roots that sign the service's certificate; ``None`` with ``enabled``: the system's roots."""
    cert: bytes | None = None
    """PEM client certificate chain (mutual TLS), with ``key``."""
    key: bytes | None = None
    server_name: str = ""
    """Expected name in the service's certificate, when the address's host is not it (a port-forward)."""

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> TlsConfig:
        env = dict(os.environ if env is None else env)
        read = lambda name: Path(env[name]).expanduser().read_bytes() if env.get(name) else None  # noqa: E731
        cert, key = read("RAYFT_TLS_CERT"), read("RAYFT_TLS_KEY")
        if (cert is None) != (key is None):
            raise SpecError("RAYFT_TLS_CERT", "give RAYFT_TLS_CERT and RAYFT_TLS_KEY together (a client certificate and its key)")
        ca = read("RAYFT_TLS_CA")
        enabled = ca is not None or cert is not None or env.get("RAYFT_TLS", "0") not in ("0", "", "false", "no")
        return cls(enabled=enabled, ca=ca, cert=cert, key=key, server_name=env.get("RAYFT_TLS_SERVER_NAME", ""))

    def credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert)


def channel(address: str, tls: TlsConfig, options: Sequence[tuple[str, Any]] = (), aio: bool = False) -> Any:
    """A channel to ``address``: TLS when ``tls.enabled``; otherwise plaintext, to a loopback host only."""
    options = list(options)
    if tls.enabled:
        if tls.server_name:
            options.append(("grpc.ssl_target_name_override", tls.server_name))
        make = grpc.aio.secure_channel if aio else grpc.secure_channel
        return make(address, tls.credentials(), options=options)
    host = address.rsplit(":", 1)[0].strip("[]") if ":" in address else address
    if not is_loopback(host):
        raise PlaintextRefused(
            "RAYFT_TLS_CA",
            f"refusing a plaintext channel to {address}: tokens would cross the network in clear; set "
            "RAYFT_TLS_CA to the CA that signs the service's certificate (or RAYFT_TLS=1 for the system's roots)",
        )
    return (grpc.aio.insecure_channel if aio else grpc.insecure_channel)(address, options=options)


WATCH_ADDRESS_KEY = "rayft-watch-address"
"""Trailing metadata of a ``WatchJob`` that the API port refuses with FAILED_PRECONDITION: where the
service's watch process serves the streams. ``:PORT`` means the host the caller dialed, on that port."""


def watch_target(api_address: str, advertised: str) -> str:
    """The address to watch at: ``advertised`` as the service sent it, with ``:PORT`` put on the host of
    ``api_address`` (``[::1]:50051`` and ``:50052`` give ``[::1]:50052``)."""
    if not advertised.startswith(":"):
        return advertised
    host = api_address.rsplit(":", 1)[0] if api_address.rsplit(":", 1)[-1].isdigit() else api_address
    return f"{host}{advertised}"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False
