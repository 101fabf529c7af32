# The image KubeRay runs (k8s/): Ray 2.60 on CUDA with rayft installed. Build from the repo root:
#   docker build -t rayft:0.1.0 .
# (Not built in CI, which has no Docker engine; the manifests that use it are schema-checked in tests/k8s.)
FROM rayproject/ray:2.60.0-py311-cu128
WORKDIR /app
COPY pyproject.toml README.md ./
COPY rayft_contract rayft_contract
COPY ray_jobs ray_jobs
COPY rayft rayft
COPY service service
RUN pip install --no-cache-dir ".[train]"
