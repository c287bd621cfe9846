#!/usr/bin/env bash
# Build the container image with its OCI labels filled in: the version from CMakeLists.txt, the
# git revision and remote, the date. podman builds with --format docker, the only image format
# that keeps the HEALTHCHECK; docker's images are that format already.
#   usage: deploy/build-image.sh [ENGINE BUILD ARGS...]    (e.g. -t attnd:0.1.0)
#   ATTND_IMAGE_ENGINE=podman|docker|PATH (default: podman when installed, else docker)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd -P)
engine=${ATTND_IMAGE_ENGINE:-$(command -v podman || command -v docker || echo podman)}
version=$(sed -n 's/^project(attnd VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
[ -n "$version" ] || { echo "build-image: no project version in $root/CMakeLists.txt"; exit 1; }
revision=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo "")
source=$(git -C "$root" remote get-url origin 2>/dev/null || echo "")
format=()
case "$(basename "$engine")" in
podman* | buildah*) format=(--format docker) ;;
esac
exec "$engine" build "${format[@]}" -f "$root/deploy/Containerfile" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
    --build-arg "CREATED=$(date -u +%Y-%m-%dT%H:%M:%SZ)" --build-arg "SOURCE=$source" \
    "$@" "$root"
