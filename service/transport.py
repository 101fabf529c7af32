"""How the service's gRPC servers listen: their credentials, keepalive and message limit (the API, watch and
report servers share them)."""

from __future__ import annotations

import grpc

from service.settings import ServiceSettings

MAX_MESSAGE_BYTES = 2 * 1024 * 1024
"""What the server reads of one message: above the largest spec (``MAX_SPEC_BYTES``) and event, so a
spec a little over its limit gets a message naming it, while megabytes are cut off by gRPC itself."""
KEEPALIVE = [
    ("grpc.keepalive_time_ms", 30_000),  # ping idle streams every 30 s so proxies keep them open
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]


def server_credentials(settings: ServiceSettings, client_certs: bool) -> grpc.ServerCredentials | None:
    """TLS with the service's certificate; ``client_certs``: also require one signed by ``tls_client_ca``."""
    if not settings.tls:
        return None
    key_and_chain = [(settings.tls_key.read_bytes(), settings.tls_cert.read_bytes())]  # type: ignore[union-attr]
    if client_certs and settings.tls_client_ca is not None:
        return grpc.ssl_server_credentials(key_and_chain, settings.tls_client_ca.read_bytes(), require_client_auth=True)
    return grpc.ssl_server_credentials(key_and_chain)


def bind(server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None) -> int:
    return server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
