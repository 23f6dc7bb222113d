#!/usr/bin/env bash
# scripts/image.sh [OUT] [NAME]: dama's container image, from scratch, as an
# OCI archive: OUT (default bin/dama-image.tar), named NAME (default
# docker.io/library/dama:dev, which a pod names dama:dev). No base image,
# no registry, no Docker: the static dama of the Kubernetes module (which runs pods too),
# dama-taskrunner and dama-shim of scripts/build.sh, a passwd naming the user it runs as (65532, "dama"),
# and the host's CA bundle, for a DATABASE_URL with sslmode=verify-full.
# Load it with `ctr -n k8s.io images import OUT` (a node's containerd),
# `podman load -i OUT` or `docker load -i OUT` (Docker 25+), then tag and
# push it where the cluster pulls from.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-oci.sh
out=${1:-bin/dama-image.tar}
name=${2:-docker.io/library/dama:dev}
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
# The image's dama runs pods too.
DAMA_BUILD_KUBERNETES=1 scripts/build.sh "$root/bin" >/dev/null
mkdir -p "$root/rootfs/etc/ssl/certs" "$root/rootfs/tmp"
chmod 1777 "$root/rootfs/tmp"
install -m 0755 "$root/bin/dama" "$root/bin/dama-taskrunner" "$root/bin/dama-shim" "$root/rootfs/"
printf 'root:x:0:0::/:/sbin/nologin\ndama:x:65532:65532::/tmp:/sbin/nologin\n' > "$root/rootfs/etc/passwd"
printf 'root:x:0:\ndama:x:65532:\n' > "$root/rootfs/etc/group"
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
	install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/rootfs/etc/ssl/certs/"
fi
chmod 0755 "$root/rootfs" "$root/rootfs/etc" "$root/rootfs/etc/ssl" "$root/rootfs/etc/ssl/certs"
chmod 0644 "$root/rootfs/etc/passwd" "$root/rootfs/etc/group"
mkdir -p "$(dirname "$out")"
oci_archive "$name" "$out" "$root/rootfs" '["/dama"]' 65532:65532 "$(git rev-parse HEAD 2>/dev/null || true)"
echo "$out: $name, $(du -h "$out" | cut -f1)"
