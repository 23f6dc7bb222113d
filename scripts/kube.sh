#!/usr/bin/env bash
# scripts/kube.sh up|down|env: a one-node Kubernetes cluster on this machine,
# for dama's Kubernetes tests (scripts/test-kubernetes.sh), built from pinned
# sources: kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
# kube-proxy and kubectl from the k8s.io/kubernetes module at
# DAMA_KUBE_VERSION (the ./staging replaces swapped for the published
# k8s.io/* modules), cached between runs; etcd, containerd, runc and the CNI
# plugins from Debian. No image is pulled: the pause image is built here, and
# dama's (scripts/image.sh) is loaded as dama:dev.
#
#   up    builds what is missing (the first time, tens of minutes), starts
#         the cluster if it is not running, loads dama:dev again, and prints
#         the exports to use it (KUBECONFIG, PATH with kubectl).
#   down  stops every process it started, its containers, mounts, network
#         namespaces, links and iptables rules, and removes its state.
#   env   prints the exports again.
#   node  starts the node's kubelet and kube-proxy if they are not running
#         (a test killed its kubelet), and waits for the node to be Ready.
#
# Runs as root (containers, mounts, iptables), on cgroup v1 or v2, with or
# without systemd. The node is 10.241.0.1, on a link of its own, so
# that nothing depends on this machine's address or host name; its pods are
# in 10.244.0.0/24 on a bridge, services in 10.96.0.0/16 (kube-proxy,
# iptables), and there is no cluster DNS: pods reach the database by
# address.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

kube_version=${DAMA_KUBE_VERSION:-v1.34.4}
cache=${DAMA_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dama-kube}/$kube_version
bin=$cache/bin
state=${DAMA_KUBE_DIR:-/tmp/dama-kube}
node_ip=10.241.0.1
node_name=dama-node
link=dama-kube0
bridge=dama-cni0
pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/16
service_ip=10.96.0.1
etcd_port=23790
api_port=6443
components="kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl"

log() { echo "kube.sh: $*" >&2; }
die() { log "$*"; exit 1; }

# build builds the components missing from the cache.
build() {
	local missing=() c
	for c in $components; do
		[ -x "$bin/$c" ] || missing+=("$c")
	done
	[ ${#missing[@]} -eq 0 ] && return
	log "building ${missing[*]} $kube_version into $bin (the first time takes tens of minutes)"
	mkdir -p "$cache/build" "$bin"
	(
		cd "$cache/build"
		local gomod
		gomod=$(go mod download -json "k8s.io/kubernetes@$kube_version" | sed -n 's/.*"GoMod": "\(.*\)",*/\1/p')
		# The module's own replaces point into its ./staging, which a
		# module requiring it cannot see: the same modules as published,
		# at the release's staging version (v1.34.4: v0.34.4).
		{
			echo "module dama.local/kube"
			echo "go 1.24.0"
			echo "require k8s.io/kubernetes $kube_version"
			echo "replace ("
			sed -n 's#^[[:space:]]*\(k8s\.io/[a-z0-9-]*\) => \./staging/src/k8s\.io/[a-z0-9-]*$#\t\1 => \1 v0.'"${kube_version#v1.}"'#p' "$gomod"
			echo ")"
		} > go.mod
		GOFLAGS=-mod=mod go get $(for c in "${missing[@]}"; do echo "k8s.io/kubernetes/cmd/$c@$kube_version"; done) >/dev/null 2>&1
		for c in "${missing[@]}"; do
			CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath \
				-ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$kube_version -X k8s.io/client-go/pkg/version.gitVersion=$kube_version" \
				-o "$bin/" "k8s.io/kubernetes/cmd/$c"
			log "built $c"
		done
	)
}

# packages installs Debian's etcd, containerd, runc and CNI plugins, and
# the tools the components call, when missing.
packages() {
	local need=()
	command -v etcd >/dev/null || need+=(etcd-server)
	command -v containerd >/dev/null || need+=(containerd)
	command -v runc >/dev/null || need+=(runc)
	[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
	command -v iptables >/dev/null || need+=(iptables)
	command -v conntrack >/dev/null || need+=(conntrack)
	command -v openssl >/dev/null || need+=(openssl)
	# The tests' task image: a user's image that is not dama's.
	[ -x /bin/busybox ] || need+=(busybox-static)
	[ ${#need[@]} -eq 0 ] && return
	log "installing ${need[*]}"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
}

# cert NAME CN [O] [SAN]: a key and a certificate signed by the cluster's CA.
cert() {
	local name=$1 cn=$2 o=${3:-} san=${4:-} subj
	subj="/CN=$cn"
	[ -n "$o" ] && subj="/O=$o$subj"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$state/pki/$name.key" -subj "$subj" -out "$state/pki/$name.csr" 2>/dev/null
	local ext=$state/pki/$name.ext
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[ -n "$san" ] && echo "subjectAltName=$san"
	} > "$ext"
	openssl x509 -req -in "$state/pki/$name.csr" -CA "$state/pki/ca.crt" -CAkey "$state/pki/ca.key" -CAcreateserial \
		-days 3650 -extfile "$ext" -out "$state/pki/$name.crt" 2>/dev/null
	rm -f "$state/pki/$name.csr" "$ext"
}

# kubeconfig NAME USER: a kubeconfig for the certificate NAME.
kubeconfig() {
	local name=$1 user=$2
	cat > "$state/$name.kubeconfig" <<-EOF
	apiVersion: v1
	kind: Config
	clusters:
	- name: dama
	  cluster:
	    certificate-authority: $state/pki/ca.crt
	    server: https://$node_ip:$api_port
	users:
	- name: $user
	  user:
	    client-certificate: $state/pki/$name.crt
	    client-key: $state/pki/$name.key
	contexts:
	- name: dama
	  context: {cluster: dama, user: $user}
	current-context: dama
	EOF
}

pki() {
	[ -f "$state/pki/ca.crt" ] && return
	mkdir -p "$state/pki"
	chmod 700 "$state/pki"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$state/pki/ca.key" -out "$state/pki/ca.crt" \
		-days 3650 -subj "/CN=dama-kube-ca" 2>/dev/null
	cert apiserver kube-apiserver "" "IP:$node_ip,IP:$service_ip,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	cert apiserver-kubelet kube-apiserver-kubelet-client system:masters
	cert admin admin system:masters
	cert controller-manager system:kube-controller-manager
	cert scheduler system:kube-scheduler
	cert proxy system:kube-proxy
	cert node "system:node:$node_name" system:nodes
	openssl genrsa -out "$state/pki/sa.key" 2048 2>/dev/null
	openssl rsa -in "$state/pki/sa.key" -pubout -out "$state/pki/sa.pub" 2>/dev/null
	local k
	for k in admin controller-manager scheduler proxy node; do
		kubeconfig "$k" "$k"
	done
}

# start NAME CMD...: runs CMD in a process group of its own, logging to
# $state/log/NAME.log, its pid in $state/run/NAME.pid; nothing if it runs.
start() {
	local name=$1
	shift
	if running "$name"; then
		return
	fi
	mkdir -p "$state/log" "$state/run"
	setsid "$@" >>"$state/log/$name.log" 2>&1 </dev/null &
	echo $! > "$state/run/$name.pid"
}

running() {
	local pid
	pid=$(cat "$state/run/$1.pid" 2>/dev/null) || return 1
	kill -0 "$pid" 2>/dev/null
}

# await WHAT SECONDS CMD...: waits until CMD succeeds.
await() {
	local what=$1 secs=$2 i
	shift 2
	for ((i = 0; i < secs * 5; i++)); do
		if "$@" >/dev/null 2>&1; then
			return
		fi
		sleep 0.2
	done
	die "$what did not come up within ${secs}s: see $state/log"
}

network() {
	if ! ip link show "$link" >/dev/null 2>&1; then
		# A bridge without ports, as a dummy link (this kernel may have
		# no dummy driver): its address is the host's all the same.
		ip link add "$link" type bridge
		ip addr add "$node_ip/32" dev "$link"
		ip link set "$link" up
	fi
	sysctl -qw net.ipv4.ip_forward=1
	modprobe br_netfilter 2>/dev/null || true
	sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
	mkdir -p "$state/cni"
	cat > "$state/cni/10-dama.conflist" <<-EOF
	{
	  "cniVersion": "0.4.0",
	  "name": "dama",
	  "plugins": [
	    {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true,
	     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$state/cni/ipam"}},
	    {"type": "portmap", "capabilities": {"portMappings": true}},
	    {"type": "loopback"}
	  ]
	}
	EOF
}

containerd_up() {
	mkdir -p "$state/containerd"
	cat > "$state/containerd/config.toml" <<-EOF
	version = 2
	root = "$state/containerd/root"
	state = "$state/containerd/state"
	[grpc]
	  address = "$state/containerd/containerd.sock"
	[plugins."io.containerd.grpc.v1.cri"]
	  sandbox_image = "docker.io/dama/pause:dev"
	  # A negative oom_score_adj (a sandbox's -998) fails runc's init on
	  # this machine: none below containerd's own.
	  restrict_oom_score_adj = true
	  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
	    runtime_type = "io.containerd.runc.v2"
	    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
	      SystemdCgroup = false
	  [plugins."io.containerd.grpc.v1.cri".cni]
	    bin_dir = "/usr/lib/cni"
	    conf_dir = "$state/cni"
	EOF
	start containerd containerd --config "$state/containerd/config.toml"
	await containerd 30 ctr -a "$state/containerd/containerd.sock" version
}

# images builds the pause image, dama's, and the tests' task image (a
# static busybox as sh, sleep and friends: a user's image with a shell),
# and loads them into the node.
images() {
	. "$repo/scripts/lib-oci.sh"
	local work
	work=$(mktemp -d)
	mkdir -p "$work/pause"
	CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/pause/pause" "$repo/scripts/kube/pause"
	oci_archive docker.io/dama/pause:dev "$work/pause.tar" "$work/pause" '["/pause"]' 65535:65535
	"$repo/scripts/image.sh" "$work/dama.tar" docker.io/library/dama:dev >/dev/null
	mkdir -p "$work/task/bin" "$work/task/tmp"
	chmod 1777 "$work/task/tmp"
	install -m 0755 /bin/busybox "$work/task/bin/busybox"
	local t
	for t in sh sleep echo cat head dd seq true false kill env; do
		ln -s busybox "$work/task/bin/$t"
	done
	oci_archive docker.io/dama/task:dev "$work/task.tar" "$work/task" '["/bin/sh"]' 1000:1000
	for t in pause dama task; do
		ctr -a "$state/containerd/containerd.sock" -n k8s.io images import "$work/$t.tar" >/dev/null
	done
	rm -rf "$work"
}

control_plane() {
	start etcd etcd --name dama --data-dir "$state/etcd" \
		--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
		--listen-peer-urls "http://127.0.0.1:$((etcd_port + 10))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 10))" \
		--initial-cluster "dama=http://127.0.0.1:$((etcd_port + 10))"
	await etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"
	local p=$state/pki
	start kube-apiserver "$bin/kube-apiserver" \
		--etcd-servers="http://127.0.0.1:$etcd_port" \
		--bind-address="$node_ip" --advertise-address="$node_ip" --secure-port="$api_port" \
		--service-cluster-ip-range="$service_cidr" \
		--tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
		--client-ca-file="$p/ca.crt" \
		--kubelet-client-certificate="$p/apiserver-kubelet.crt" --kubelet-client-key="$p/apiserver-kubelet.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--allow-privileged=true --kubelet-preferred-address-types=InternalIP --anonymous-auth=false
	await kube-apiserver 120 "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" get --raw /readyz
	start kube-controller-manager "$bin/kube-controller-manager" \
		--kubeconfig="$state/controller-manager.kubeconfig" --leader-elect=false \
		--service-account-private-key-file="$p/sa.key" --root-ca-file="$p/ca.crt" \
		--cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
		--use-service-account-credentials=true --service-cluster-ip-range="$service_cidr"
	start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$state/scheduler.kubeconfig" --leader-elect=false
}

node() {
	mkdir -p "$state/kubelet"
	cat > "$state/kubelet.yaml" <<-EOF
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	address: $node_ip
	readOnlyPort: 0
	authentication:
	  anonymous: {enabled: false}
	  webhook: {enabled: true}
	  x509: {clientCAFile: $state/pki/ca.crt}
	authorization: {mode: Webhook}
	cgroupDriver: cgroupfs
	failCgroupV1: false
	failSwapOn: false
	containerRuntimeEndpoint: unix://$state/containerd/containerd.sock
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
	resolvConf: /etc/resolv.conf
	EOF
	start kubelet "$bin/kubelet" --config="$state/kubelet.yaml" --kubeconfig="$state/node.kubeconfig" \
		--root-dir="$state/kubelet" --hostname-override="$node_name" --node-ip="$node_ip"
	start kube-proxy "$bin/kube-proxy" --kubeconfig="$state/proxy.kubeconfig" --hostname-override="$node_name" \
		--cluster-cidr="$pod_cidr" --proxy-mode=iptables
	await "node $node_name" 120 "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" wait --for=condition=Ready "node/$node_name" --timeout=1s
	# A pod needs its namespace's default service account, which the
	# controller manager makes.
	await "the default service account" 60 "$bin/kubectl" --kubeconfig "$state/admin.kubeconfig" get serviceaccount default
}

exports() {
	echo "export KUBECONFIG=$state/admin.kubeconfig"
	echo "export PATH=$bin:\$PATH"
}

up() {
	[ "$(id -u)" = 0 ] || die "run as root: a node runs containers"
	packages
	build
	mkdir -p "$state"
	pki
	network
	containerd_up
	images
	control_plane
	node
	exports
}

down() {
	[ -d "$state" ] || return 0
	local name pid
	for name in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do
		if pid=$(cat "$state/run/$name.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
			kill -- "-$pid" 2>/dev/null || true
		fi
	done
	# The containers, by their shims, which run outside containerd's group.
	local sock=$state/containerd/containerd.sock
	if [ -S "$sock" ]; then
		local t
		for t in $(ctr -a "$sock" -n k8s.io tasks ls -q 2>/dev/null); do
			ctr -a "$sock" -n k8s.io tasks kill -a -s SIGKILL "$t" 2>/dev/null || true
		done
	fi
	pkill -9 -f "containerd-shim-runc-v2 -namespace k8s.io .*-address $sock" 2>/dev/null || true
	if pid=$(cat "$state/run/containerd.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; then
		kill -- "-$pid" 2>/dev/null || true
	fi
	for name in kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd containerd; do
		if pid=$(cat "$state/run/$name.pid" 2>/dev/null); then
			for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
			kill -9 -- "-$pid" 2>/dev/null || true
		fi
	done
	# Mounts under the state directory, deepest first; the pods' network
	# namespaces; the links; kube-proxy's and the CNI plugins' rules.
	{ grep -o " $state[^ ]*" /proc/mounts || true; } | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	for ns in /var/run/netns/cni-*; do
		[ -e "$ns" ] || continue
		umount "$ns" 2>/dev/null || true
		rm -f "$ns"
	done
	ip link del "$bridge" 2>/dev/null || true
	ip link del "$link" 2>/dev/null || true
	if [ -x "$bin/kube-proxy" ]; then
		"$bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
	fi
	{ iptables-save -t nat 2>/dev/null | grep -oE '^:CNI-[A-Za-z0-9-]+' || true; } | cut -c2- | while read -r c; do
		iptables -t nat -F "$c" 2>/dev/null || true
	done
	# The kubelet's cgroups, emptied with their processes gone: in each
	# hierarchy of cgroup v1, or in v2's one.
	local cg
	for cg in /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/kubepods; do
		[ -d "$cg" ] && find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	# The kubelet's own chains (kube-proxy --cleanup leaves them).
	local ipt table chain
	for ipt in iptables ip6tables; do
		command -v "$ipt" >/dev/null || continue
		for table in filter nat mangle; do
			while "$ipt" -t "$table" -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
			while "$ipt" -t "$table" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
			for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
				"$ipt" -t "$table" -F "$chain" 2>/dev/null || true
				"$ipt" -t "$table" -X "$chain" 2>/dev/null || true
			done
		done
	done
	rm -rf "$state"
}

case "${1:-}" in
up) up ;;
down) down ;;
env) exports ;;
node) node ;;
*) die "usage: scripts/kube.sh up|down|env|node" ;;
esac
