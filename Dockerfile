# The Ray nodes' image (k8s/: the RayCluster's head and GPU workers, and RayJobs): Ray 2.60 on CUDA 12.8
# with rayft and the pinned training stack. Build from the repo root, with the base pinned by digest:
#   RAY_BASE_DIGEST=$(docker buildx imagetools inspect rayproject/ray:2.60.0-py311-cu128 --format '{{json .Manifest.Digest}}' | tr -d '"')
#   docker build --build-arg RAY_BASE_DIGEST=$RAY_BASE_DIGEST -t rayft-ray:0.1.0 .
# The build refuses to run without the digest: a tag can move under a release, a digest cannot.
# (Not built in CI, which has no Docker engine; the manifests that use it are validated in tests/k8s.)
ARG RAY_BASE=rayproject/ray:2.60.0-py311-cu128
ARG RAY_BASE_DIGEST

# Stage 1: wheels for rayft and every pinned dependency (constraints.txt), built where a compiler may be.
FROM ${RAY_BASE}@${RAY_BASE_DIGEST} AS wheels
WORKDIR /src
COPY pyproject.toml README.md constraints.txt ./
COPY rayft_contract rayft_contract
COPY ray_jobs ray_jobs
COPY rayft rayft
COPY service service
RUN pip wheel --no-cache-dir -c constraints.txt --wheel-dir /wheels ".[gpu]"

# Stage 2: the runtime, with the wheels installed and nothing of the build left.
FROM ${RAY_BASE}@${RAY_BASE_DIGEST}
USER root
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "rayft[gpu]" \
 && groupadd --gid 10001 rayft && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp rayft
# k8s/ runs it as 10001 with a read-only root: HOME, caches and Ray's session directory are volumes.
ENV HOME=/tmp HF_HOME=/cache/hf TRITON_CACHE_DIR=/cache/triton MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
WORKDIR /tmp
