#!/usr/bin/env bash
# Builds .moto/moto-site.tar.xz (git-ignored): moto's S3 server and its dependencies for the device's Python 3.12,
# for bench/founding_device.sh. It is a tree of its own, put only on the moto server's PYTHONPATH
# (bench/s3_data_bench.py, MOTO_SITE): installed beside ray and transformers in .gpu, moto's wheels broke
# transformers' imports there. botocore's service models are cut to the few S3 needs, so that .gpu and this
# fit the device's 64 MiB carry together.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qxF '/.moto/' .git/info/exclude 2>/dev/null || echo '/.moto/' >> .git/info/exclude
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$work/wheels" "moto[s3]==${MOTO_VERSION:-5.2.5}" flask flask-cors  # the server without [server], whose other services pull cfn-lint and sympy
mkdir -p "$work/site" .moto
for w in "$work"/wheels/*.whl; do unzip -q -o "$w" -d "$work/site"; done
(cd "$work/site/botocore/data" && ls -d */ | grep -vxE 's3/|s3control/|sts/|iam/' | xargs rm -rf)
(cd "$work/site" && tar -cf - . | xz -T0 -6) > .moto/moto-site.tar.xz
du -sh .moto/moto-site.tar.xz
