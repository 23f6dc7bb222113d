#!/usr/bin/env bash
# The latency benchmark (README "Speed"), without the race detector, against
# TEST_DATABASE_URL or a throwaway PostgreSQL cluster. Extra arguments go to
# go test, e.g. scripts/bench.sh -benchtime 1000x.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

dama_pg_use TEST_DATABASE_URL

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $(psql "$TEST_DATABASE_URL" -AtqX -c 'SHOW server_version')"
go test -run '^$' -bench Latency -benchtime 300x -count=1 "$@" ./supervisor
