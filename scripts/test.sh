#!/usr/bin/env bash
# The project's test command: go vet and the whole test suite under the race
# detector, against TEST_DATABASE_URL or a throwaway PostgreSQL cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

# --slow runs the whole suite with half this machine's CPU (see slow_join).
slow=false
go_timeout=30m
if [ "${1:-}" = --slow ]; then
	shift
	slow=true
	# Everything runs about twice as long: go test's own deadline too.
	go_timeout=60m
fi

# One cleanup for every way the script ends: the binaries, the throwaway
# cluster, the control group of --slow; each only once this script made
# it, never what the environment names. The test binaries make the
# directories these name themselves (testenv.Main), and chown the second
# to the servers' user: never one the environment names.
unset DAMA_TEST_BIN_DIR DAMA_TEST_PGDATA DAMA_TEST_TEMPLATE
slow_cg=
cleanup() {
	[ -z "${DAMA_TEST_BIN_DIR:-}" ] || rm -rf "$DAMA_TEST_BIN_DIR"
	dama_pg_stop
	slow_cg_remove
}
trap cleanup EXIT

# slow_join moves this script into a control group of its own, a child of
# its own in the cpu hierarchy, limited to one core's worth of CPU
# (cpu.cfs_quota_us equal to cpu.cfs_period_us; cpu.max on cgroup v2):
# every process and server started from here on runs in it, as on a
# slower machine of the same kind, reproducibly. Needs root.
slow_join() {
	[ "$(id -u)" -eq 0 ] || { echo "test.sh --slow: needs root, to make a control group" >&2; exit 1; }
	local base here
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		base=/sys/fs/cgroup
		here=$(awk -F: '$1 == "0" {print $3}' /proc/self/cgroup)
		grep -qw cpu "$base$here/cgroup.subtree_control" 2>/dev/null ||
			{ echo "test.sh --slow: the cpu controller is not enabled below $base$here (cgroup.subtree_control)" >&2; exit 1; }
	elif [ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
		base=/sys/fs/cgroup/cpu
		here=$(awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' /proc/self/cgroup)
	else
		echo "test.sh --slow: no cpu controller under /sys/fs/cgroup (v1 cpu/ or v2 cgroup.controllers)" >&2
		exit 1
	fi
	here=${here%/}
	# Named for this run alone: a group of another, even of a PID reused,
	# is never taken for this one's (and emptied by slow_cg_remove).
	local cg=$base$here/dama-test-slow.$$.$RANDOM$RANDOM
	mkdir "$cg"
	slow_cg=$cg
	# 10 ms periods: with the default 100 ms, the group runs on both
	# cores for 50 ms, then every process in it (a server's backend
	# holding a lock among them) stops for 50 ms, which no slower CPU
	# does.
	if [ "$base" = /sys/fs/cgroup ]; then
		echo "10000 10000" >"$slow_cg/cpu.max"
	else
		echo 10000 >"$slow_cg/cpu.cfs_period_us"
		echo 10000 >"$slow_cg/cpu.cfs_quota_us"
	fi
	echo $$ >"$slow_cg/cgroup.procs"
	echo "test.sh --slow: one core's worth of CPU ($(nproc) here), in $slow_cg" >&2
}

# slow_cg_remove moves this script back where it was and removes the
# group. A process still in it (the cluster is stopped by then) is one a
# test leaked, or one of an interrupted run: it is named and killed.
slow_cg_remove() {
	[ -n "$slow_cg" ] || return 0
	echo $$ >"$(dirname "$slow_cg")/cgroup.procs"
	local left
	left=$(cat "$slow_cg/cgroup.procs")
	if [ -n "$left" ]; then
		echo "test.sh --slow: processes left behind in $slow_cg, killed:" >&2
		ps -o pid,args -p "$(echo $left | tr ' ' ,)" >&2 || true
		kill -KILL $left 2>/dev/null || true
		for _ in $(seq 50); do
			[ -z "$(cat "$slow_cg/cgroup.procs")" ] && break
			sleep 0.1
		done
	fi
	rmdir "$slow_cg" || echo "test.sh --slow: $slow_cg is left" >&2
}

# The fault tests start servers of their own (from the binaries
# dama_pg_install provides) and silence connections with nftables, which
# needs root: as another user they are skipped.
dama_pg_install
if [ "$(id -u)" -eq 0 ] && ! command -v nft >/dev/null; then
	echo "nft not found: installing Debian's nftables package" >&2
	apt-get update -qq >&2 &&
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >&2 ||
		{ echo "installing nftables failed" >&2; exit 1; }
fi

# The status page's test drives a headless Chromium: Debian's, installed
# here when missing. As root Chromium runs without its sandbox (the test
# passes --no-sandbox), which it refuses to do otherwise.
if ! command -v chromium >/dev/null; then
	if [ "$(id -u)" -eq 0 ]; then
		echo "chromium not found: installing Debian's chromium package" >&2
		apt-get update -qq >&2 &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >&2 ||
			{ echo "installing chromium failed" >&2; exit 1; }
	else
		echo "chromium not found, and not root to install it: the browser test will fail" >&2
	fi
fi
export DAMA_TEST_BROWSER=required

# Submitting from SQL is tested from Python, with Debian's psycopg2
# (python3-psycopg2), and the task examples of docs/tasks.md run with
# Python and jq: installed here when missing.
missing=()
/usr/bin/python3 -c 'import psycopg2' 2>/dev/null || missing+=(python3-psycopg2)
command -v jq >/dev/null || missing+=(jq)
if [ "${#missing[@]}" -gt 0 ]; then
	if [ "$(id -u)" -eq 0 ]; then
		echo "${missing[*]} not found: installing Debian's packages" >&2
		apt-get update -qq >&2 &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2 ||
			{ echo "installing ${missing[*]} failed" >&2; exit 1; }
	else
		echo "${missing[*]} not found, and not root to install them: the tests of SQL submission and of the examples will fail" >&2
	fi
fi
export DAMA_TEST_PYTHON=required

# The upgrade test builds the previous release from the commit CHANGELOG.md
# records, which a shallow clone lacks.
if [ "$(git rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
	echo "shallow clone: fetching the full history for the upgrade test" >&2
	git fetch --quiet --unshallow >&2 || echo "git fetch --unshallow failed; the upgrade test will say which commit is missing" >&2
fi

# The packages are installed; from here on, with --slow, everything runs
# in the slow control group, the throwaway cluster included.
if $slow; then
	slow_join
fi
if [ -z "${TEST_DATABASE_URL:-}" ]; then
	dama_pg_start
	TEST_DATABASE_URL=$DAMA_PG_URL
fi
export TEST_DATABASE_URL

# Every build here and in the tests (the binaries, the test binaries, the
# fuzz pass's, the image's, the previous release's) without the checkout's
# path: a fresh clone elsewhere compiles none of this module's packages
# again. Without it, the builds before the first test took 134 s and 237
# CPU-seconds in a fresh clone, against 88 s and 151 with it. A build
# with -trimpath records no -ldflags (go.dev/issue/52372), so the commit
# stamped there no longer tells two builds apart: -buildvcs=auto (after
# what go env sets, which may turn it off) stamps the checkout's own,
# which dama compares with its dama-taskrunner's (cmd/dama/damacli/taskprogram.go).
GOFLAGS="$(go env GOFLAGS) -trimpath -buildvcs=auto"
export GOFLAGS

go vet ./...
(cd kubernetes && go vet ./...)

# The binaries the tests run (dama, dama-taskrunner and the samples),
# built once for every package's tests: static, as
# scripts/build.sh builds them, and again with the race detector in race/,
# for the tests that watch them for data races (testenv.Build).
DAMA_TEST_BIN_DIR=$(mktemp -d /tmp/dama-test-bin.XXXXXX)
export DAMA_TEST_BIN_DIR
bins=(./cmd/dama ./cmd/dama-taskrunner ./cmd/sample-etl ./cmd/sample-embedded)
ldflags="-X github.com/dama-etl/dama/version.commit=$(git rev-parse HEAD 2>/dev/null || true)"
CGO_ENABLED=0 go build -ldflags "$ldflags" -o "$DAMA_TEST_BIN_DIR/" "${bins[@]}"
go build -race -ldflags "$ldflags" -o "$DAMA_TEST_BIN_DIR/race/" "${bins[@]}"

# Every test once, under the race detector; a test whose behaviour depends
# on the lock mode runs once per mode (row, advisory, host), in parallel
# subtests (testenv.LockModes). DAMA_TEST_PARALLEL of them run at once:
# with 8, both cores of this project's VM stay busy. A program built with
# the race detector sleeps a second before it exits (atexit_sleep_ms), the
# test binaries too: not here (testenv sets it for what the tests start).
export GORACE="${GORACE:-atexit_sleep_ms=0}"
go test -race -count=1 -timeout "$go_timeout" -parallel "${DAMA_TEST_PARALLEL:-8}" "$@" ./...
# The Kubernetes module: its launcher, a pod's task process under its shim
# and dama's image, which is built from it; its tests on a cluster are
# skipped here (scripts/test-kubernetes.sh). They run the module's own
# binaries, which its TestMain builds (testenv.Main).
(cd kubernetes && env -u DAMA_TEST_BIN_DIR go test -race -count=1 -timeout "$go_timeout" "$@" ./...)

# A short fuzz pass over the parsers of outside input, from the corpora in
# each package's testdata/fuzz and the inputs this host's Go cache kept from
# earlier runs. A fuzzing run takes one target, hence one run per "package
# target executions" line, of the package's instrumented test binary, built
# once (go test -fuzz would link it again for each target: 4 s of cmd/dama's
# each) and run as go test -fuzz runs it, from the package's directory with
# the Go cache's corpus; a failing input is written to
# <package>/testdata/fuzz/<target>/ and the script stops. The budget is a
# count of executions, not a duration: Go 1.26's fuzzer can report a bare
# "context deadline exceeded" when a -fuzztime duration ends on a busy
# machine (go.dev/issue/75804), which no count can.
fuzz_targets=(
	"./config FuzzParse 5000"
	"./config FuzzParseSchedule 5000"
	"./protocol FuzzParseLaunch 5000"
	"./protocol FuzzParseKeeperLaunch 5000"
	"./protocol FuzzParseSecrets 5000"
	# What a pod's two containers tell each other.
	"./kubernetes/shim FuzzReceive 5000"
	# What any process of the user may send a host's lock keeper.
	"./internal/keeper FuzzSession 2500"
	"./internal/keeper FuzzDecodeMessage 5000"
	"./cmd/dama/damacli FuzzDueAt 5000"
	"./cmd/dama/damacli FuzzParseID 5000"
	"./cmd/dama/damacli FuzzListenAddr 5000"
	"./cmd/dama/damacli FuzzParseOlderThan 5000"
	"./cmd/dama/internal/web FuzzParseLogPos 5000"
	"./internal/hostproc FuzzParseStat 10000"
	# What a command writes on its events pipe, and what the database is
	# given of it: against the test server, whose jsonb is the judge.
	"./taskrunner FuzzDecodeLine 5000"
	"./taskrunner FuzzPlainLineIsTheDecoders 5000"
	"./etlcontext FuzzCleanJSON 5000"
)
fuzz_dir=$DAMA_TEST_BIN_DIR/fuzz
mkdir -p "$fuzz_dir"
go_cache=$(go env GOCACHE)
declare -A fuzz_bin=()
fuzz_runs=()
for t in "${fuzz_targets[@]}"; do
	read -r pkg target count <<<"$t"
	# A package of the Kubernetes module is built in its module.
	mod=. rel=$pkg
	if [[ $pkg == ./kubernetes/* ]]; then mod=kubernetes rel=./${pkg#./kubernetes/}; fi
	if [ -z "${fuzz_bin[$pkg]:-}" ]; then
		fuzz_bin[$pkg]=$fuzz_dir/${#fuzz_bin[@]}.test
		go -C "$mod" test -c -fuzz=. -o "${fuzz_bin[$pkg]}" "$rel"
	fi
	fuzz_runs+=("$pkg" "$(go -C "$mod" list "$rel")" "${fuzz_bin[$pkg]}" "$target" "$count")
done
# Three runs at once, one worker each: a run of a few thousand executions
# spends most of its time starting and replaying its corpus, one process
# at a time (58 s one after the other, two workers each; 26 s so).
fuzz_one() {
	echo "fuzz $2 $4: $5 executions"
	cd "$1" && "$3" -test.run '^$' -test.fuzz "^$4\$" -test.fuzztime "$5x" -test.parallel 1 \
		-test.fuzzcachedir "$go_cache/fuzz/$2" -test.timeout 10m -test.paniconexit0
}
export -f fuzz_one
export go_cache
printf '%s\0' "${fuzz_runs[@]}" | xargs -0 -n 5 -P 3 bash -c 'fuzz_one "$@"' fuzz_one
