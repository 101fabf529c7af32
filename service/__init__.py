"""The rayft gRPC service: job store, launcher, progress stream. Never imports torch."""
