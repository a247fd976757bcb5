#!/usr/bin/env bash
# CI only: build a stand-in for python:3.11-slim-bookworm where no image registry can be reached.
# A Debian bookworm root filesystem (mmdebstrap, the host's apt sources), imported and topped with a
# layer that makes the system Python behave like the official image's and trusts the host's CA
# bundle (egress passes a TLS-intercepting proxy). Nothing here goes into the product's Dockerfile.
set -euo pipefail
TAG=${BASE_IMAGE:-python:3.11-slim-bookworm}
DOCKER=${DOCKER:-docker}
if $DOCKER image inspect "$TAG" >/dev/null 2>&1; then
  echo "stand-in base $TAG already present"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mmdebstrap --quiet --variant=apt --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$work/rootfs.tar"
$DOCKER import "$work/rootfs.tar" warmpool-ci/debian-python:bookworm
cp /etc/ssl/certs/ca-certificates.crt "$work/host-ca.crt"
cp "$(dirname "$0")/standin.Dockerfile" "$work/Dockerfile"
$DOCKER build -q -t "$TAG" "$work"
