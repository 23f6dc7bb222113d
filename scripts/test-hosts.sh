#!/usr/bin/env bash
# The cut-host test (internal/scalebench TestHostsCut): 3 hosts on this
# machine, each in network, UTS, PID and mount namespaces of its own, 30
# host-mode tasks among them, one PostgreSQL server on their bridge; one
# host is cut off with nftables (packets dropped both ways, no RST), and the
# test asserts that its commands stop within the fence bound, that its tasks
# run again on the other hosts within 90 s, that no two attempts of a task
# ever run at once (as processes, by a flock each command takes, and as
# server sessions, sampled every 10 ms), that the host, back, starts
# nothing, and that every task ends DONE. Root only, a few minutes: not
# part of scripts/test.sh or CI. It removes every namespace, link, nftables
# table and process it made, even when it fails or is interrupted. One run
# at a time (scripts/bench.sh hosts included): a run holds
# /run/damah-hosts.lock, and a second fails at once. Extra arguments go to
# go test.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh
if [ "$(id -u)" -ne 0 ]; then
	echo "test-hosts.sh needs root (namespaces, nftables)" >&2
	exit 1
fi
dama_pg_install
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; kernel $(uname -r); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
DAMA_TEST_HOSTS=1 exec go test -run '^TestHostsCut$' -count=1 -v -timeout 20m "$@" ./internal/scalebench
