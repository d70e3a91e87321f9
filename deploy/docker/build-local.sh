#!/usr/bin/env bash
# Builds gossamer's container image without pulling any base image (Containerfile.local,
# FROM scratch): the release binary and the shared libraries it links, copied from this
# machine. For machines that cannot reach public container registries; elsewhere, prefer
# deploy/docker/Dockerfile (a clean build on distroless).
#
#   deploy/docker/build-local.sh [TAG]        TAG defaults to gossamer:0.1.0
#
# BINARY=path uses a binary already built (default: cargo build --release --locked).
# BUILDER=buildah|docker|podman (default: the first one installed). With buildah inside a
# container without overlayfs, set STORAGE_DRIVER=vfs.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-gossamer:0.1.0}
binary=${BINARY:-}
if [[ -z $binary ]]; then
    cargo build --release --locked --bin gossamer
    binary=target/release/gossamer
fi
builder=${BUILDER:-}
if [[ -z $builder ]]; then
    for candidate in buildah podman docker; do
        if command -v "$candidate" >/dev/null; then builder=$candidate && break; fi
    done
fi
[[ -n $builder ]] || { echo "no buildah, podman or docker: apt-get install buildah" >&2; exit 2; }

stage=$(mktemp -d -t gossamer-image.XXXXXX)
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 "$binary" "$stage/usr/local/bin/gossamer"
# Every library ldd resolves, at the path the binary looks for it (the loader included).
for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    install -D -m 0755 "$(readlink -f "$lib")" "$stage$lib"
done
case $builder in
    buildah) buildah bud -f deploy/docker/Containerfile.local -t "$tag" "$stage" ;;
    *) "$builder" build -f deploy/docker/Containerfile.local -t "$tag" "$stage" ;;
esac
echo "built $tag with $builder from $binary"
