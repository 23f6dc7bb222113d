#!/usr/bin/env bash
# The project's test command: go vet and the whole test suite under the race
# detector, against TEST_DATABASE_URL or a throwaway PostgreSQL cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

if [ -z "${TEST_DATABASE_URL:-}" ]; then
	trap dama_pg_stop EXIT
	dama_pg_start
	TEST_DATABASE_URL=$DAMA_PG_URL
fi
export TEST_DATABASE_URL

go vet ./...
go test -race -count=1 "$@" ./...
