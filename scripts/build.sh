#!/usr/bin/env bash
# Builds dama (and the sample ETL program) into DIR (default ./bin), with the
# commit stamped in: `dama version` prints it. The Go toolchain stamps it by
# itself only with -buildvcs, which some environments turn off (GOFLAGS).
# DAMA_BUILD_KUBERNETES=1 builds them from the Kubernetes module
# (kubernetes/), whose dama runs pods too (kinds with runner: kubernetes),
# as the image's does.
set -euo pipefail
cd "$(dirname "$0")/.."
# The modules of this checkout, whatever Go workspace is around it: one
# would swap the core the Kubernetes module's binaries are built from.
export GOWORK=off
out=${1:-bin}
mkdir -p "$out"
out=$(CDPATH='' cd -P -- "$out" && pwd -P)
commit=$(git rev-parse HEAD 2>/dev/null || true)
if [ -n "$commit" ] && ! git diff --quiet HEAD 2>/dev/null; then
	commit=$commit-dirty
fi
ldflags=
if [ -n "$commit" ]; then
	ldflags="-X github.com/dama-etl/dama/version.commit=$commit"
fi
# Static (no libc): a task process starts without the dynamic loader, and
# holds none of libc's pages; DNS and user lookups are Go's own (see
# docs/operations.md "Installing").
: "${CGO_ENABLED:=0}"
export CGO_ENABLED
# dama and the task processes' program beside it, in one build: a
# supervisor runs dama-taskrunner only when its build is dama's own (the
# same commit, settings and dependencies; a second go build would see the
# first's output as a change to the tree when DIR is in it).
if [ "${DAMA_BUILD_KUBERNETES:-}" = 1 ]; then
	(cd kubernetes && go build -ldflags "$ldflags" -o "$out/" ./cmd/dama ./cmd/dama-taskrunner ./cmd/dama-shim)
else
	go build -ldflags "$ldflags" -o "$out/" ./cmd/dama ./cmd/dama-taskrunner
fi
go build -o "$out/sample-etl" ./cmd/sample-etl
