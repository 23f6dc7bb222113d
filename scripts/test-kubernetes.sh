#!/usr/bin/env bash
# scripts/test-kubernetes.sh: dama's tests on Kubernetes, on the one-node
# cluster of scripts/kube.sh (started if it is not running; built the first
# time, which takes minutes), as root. Not run by .ci/run: see
# docs/testing.md.
#
# A throwaway PostgreSQL listens on the node's address for the pods, with a
# password of its own (scram-sha-256, from 10.244.0.0/24 only), given to the
# pods in a Secret. The cluster is taken down at the end unless
# DAMA_KUBE_KEEP=1.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test-kubernetes.sh: run as root: the node runs containers" >&2; exit 1; }

node_ip=10.241.0.1
pg_port=55432
ns=dama-test

eval "$(scripts/kube.sh up)"
. scripts/lib-postgres.sh
cleanup() {
	kubectl delete namespace "$ns" --wait=false >/dev/null 2>&1 || true
	dama_pg_stop
	if [ "${DAMA_KUBE_KEEP:-}" != 1 ]; then
		scripts/kube.sh down
	fi
}
trap cleanup EXIT
DAMA_PG_OPTIONS="-c listen_addresses='$node_ip' -c port=$pg_port -c password_encryption=scram-sha-256"
dama_pg_start
DAMA_PG_URL="postgres://postgres@/postgres?host=$DAMA_PG_DIR&port=$pg_port&sslmode=disable"
# The password reaches psql and kubectl on their stdin, never in argv.
password=$(openssl rand -hex 16)
psql "$DAMA_PG_URL" -qv ON_ERROR_STOP=1 >/dev/null <<EOF
ALTER ROLE postgres PASSWORD '$password';
EOF
echo "host all all 10.244.0.0/24 scram-sha-256" >> "$DAMA_PG_DIR/data/pg_hba.conf"
psql "$DAMA_PG_URL" -qc "SELECT pg_reload_conf()" >/dev/null

# A namespace left by a run that was killed goes first.
kubectl delete namespace "$ns" --ignore-not-found --wait=true --timeout=120s >/dev/null
kubectl create namespace "$ns" >/dev/null
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Secret
metadata: {name: dama-database}
stringData:
  url: postgres://postgres:$password@$node_ip:$pg_port/postgres?sslmode=disable
EOF
# The default service account exists once the controller manager made it.
for _ in $(seq 100); do kubectl -n "$ns" get serviceaccount default >/dev/null 2>&1 && break; sleep 0.2; done

# A pod of dama's image migrates the database through the node's address.
kubectl -n "$ns" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: migrate}
spec:
  restartPolicy: Never
  containers:
  - name: dama
    image: dama:dev
    imagePullPolicy: Never
    args: [migrate]
    env:
    - name: DATABASE_URL
      valueFrom: {secretKeyRef: {name: dama-database, key: url}}
EOF
if ! kubectl -n "$ns" wait --for=jsonpath='{.status.phase}'=Succeeded pod/migrate --timeout=120s >/dev/null; then
	kubectl -n "$ns" logs migrate >&2 || true
	echo "FAIL: a pod could not migrate the database" >&2
	exit 1
fi
version=$(psql "$DAMA_PG_URL" -Atc "SELECT max(version_id) FROM data_manager.schema_migrations")
echo "ok: a pod of dama:dev migrated the database to version $version through $node_ip"

# The tests on the cluster (the Kubernetes module's *OnKubernetes): each
# makes a database of its own on this server and a namespace of its own,
# and deploys the supervisor there with deploy/kubernetes. The password
# reaches them in their environment.
export DAMA_TEST_KUBE_DB_ADDR="$node_ip:$pg_port" DAMA_TEST_KUBE_DB_PASSWORD="$password" TEST_DATABASE_URL="$DAMA_PG_URL"
(cd kubernetes && go test -count=1 -timeout 30m -v -run 'OnKubernetes$' . "$@")
