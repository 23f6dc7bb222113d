#!/usr/bin/env bash
# The project's test command: go vet and the whole test suite under the race
# detector, against TEST_DATABASE_URL or a throwaway PostgreSQL cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

dama_pg_use TEST_DATABASE_URL

go vet ./...
go test -race -count=1 "$@" ./...
