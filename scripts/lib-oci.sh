# shellcheck shell=bash
# oci_archive NAME OUT ROOTFS ENTRYPOINT USER [REVISION]: writes OUT, an OCI
# image archive (the image layout, tarred) of one layer holding ROOTFS,
# named NAME (as docker.io/library/dama:dev), that runs ENTRYPOINT (a JSON
# array) as USER (uid:gid). containerd (ctr images import), Podman and
# Docker 25+ (load) read it. Reproducible: the same files give the same
# digests (times, owners and order are fixed).
oci_archive() {
	local name=$1 out=$2 rootfs=$3 entry=$4 user=$5 revision=${6:-}
	local work layer config manifest
	work=$(mktemp -d)
	mkdir -p "$work/blobs/sha256"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$work/layer" .
	layer=$(_oci_blob "$work" layer)
	printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":%s,"User":"%s","Env":["PATH=/:/bin"],"Labels":{"org.opencontainers.image.revision":"%s"}},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$entry" "$user" "$revision" "${layer%% *}" > "$work/config"
	config=$(_oci_blob "$work" config)
	printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%s}]}' \
		"${config%% *}" "${config##* }" "${layer%% *}" "${layer##* }" > "$work/manifest"
	manifest=$(_oci_blob "$work" manifest)
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
		"${manifest%% *}" "${manifest##* }" "$name" "${name##*:}" > "$work/index.json"
	printf '{"imageLayoutVersion":"1.0.0"}' > "$work/oci-layout"
	tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$work" -cf "$out" oci-layout index.json blobs
	rm -rf "$work"
}

# _oci_blob DIR FILE moves DIR/FILE to DIR/blobs/sha256/<its digest> and
# prints "<digest> <size>".
_oci_blob() {
	local digest size
	digest=$(sha256sum "$1/$2" | cut -d' ' -f1)
	size=$(stat -c %s "$1/$2")
	mv "$1/$2" "$1/blobs/sha256/$digest"
	echo "$digest $size"
}
