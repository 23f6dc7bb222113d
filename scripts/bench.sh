#!/usr/bin/env bash
# The latency benchmark (docs/performance.md "Speed"), without the race detector, against
# TEST_DATABASE_URL or a throwaway PostgreSQL cluster. Extra arguments go to
# go test, e.g. scripts/bench.sh -benchtime 1000x.
#
# scripts/bench.sh scale [SIZES [MODES]] [go test flags]: the scale benchmark
# (internal/scalebench): one supervisor with N quietly running tasks, for each
# size N and lock mode, on PostgreSQL servers of its own (TEST_DATABASE_URL
# is not used). SIZES and MODES are comma-separated, by default 50,500 and
# row,advisory (a size 0 measures a supervisor with no task). About 5
# minutes per size and mode at 500. Its environment:
#   DAMA_BENCH_WINDOW (60s)        the steady window measured
#   DAMA_BENCH_SETTLE (15s)        the wait, once all N hold their lock, before it
#   DAMA_BENCH_PROBES (40)         submit->lock samples, at 0 and at N running
#   DAMA_BENCH_FLOOR_SAMPLES (100) samples of each floor (plain River, fork/exec)
#   DAMA_BENCH_ADOPT_WAIT (25s)    how long the new supervisor may take to adopt after a SIGKILL
#   DAMA_BENCH_START_DEADLINE (10m) how long all N may take to hold their lock
# A quick run: DAMA_BENCH_WINDOW=10s DAMA_BENCH_SETTLE=11s scripts/bench.sh scale 10,50 row
#
# scripts/bench.sh burst [N [W]] [go test flags]: a burst of N (1000)
# /bin/true tasks submitted in one SQL statement to a queue of W (20) slots,
# in each lock mode (DAMA_BENCH_MODES, host,advisory,row), beside its floor
# (plain River, W workers, each job a fork/exec + connect + lock, /bin/true
# and a row), on a PostgreSQL server of its own (internal/scalebench
# BenchmarkBurst): the time, tasks/s, the ratio to the floor, the slots'
# occupancy and how long after its task's end each job was finalized; and
# per task the CPU by process, the transactions, the rows written and the
# statements (pg_stat_statements).
#
# scripts/bench.sh hosts [H,... [N]] [go test flags]: the hosts benchmark
# (internal/scalebench BenchmarkHosts; root): for each H (1,3,6), H hosts on
# this machine, each in network, UTS, PID and mount namespaces of its own
# (a veth pair to a bridge, an address, a host name, a /proc), each with a
# supervisor in host lock mode and a log_dir (a lock keeper) of its own,
# N (500) quiet tasks a host, one PostgreSQL server on the bridge: the
# server connections of each host, transactions/s with every task quiet
# (over DAMA_BENCH_WINDOW, 60s, after DAMA_BENCH_SETTLE, 15s), the task
# processes' PSS (poll_interval 1s, DAMA_BENCH_HOSTS_POLL sets another).
# At the largest H, one host's supervisor SIGKILLed and
# restarted (its tasks adopted, none relaunched), then the busiest host cut
# off with nftables (scripts/test-hosts.sh's case, at size). It removes
# every namespace, link, nftables table and process it made, even when
# interrupted, and what an interrupted run left (names damah-*).
# N=500 x H=6 runs 3,000 task processes: dama's share about 7 GB (2.4 MB
# a task), the commands' besides. A quick run:
# DAMA_BENCH_WINDOW=10s DAMA_BENCH_SETTLE=11s scripts/bench.sh hosts 1,3 20
#
# scripts/bench.sh storage [go test flags]: what chatty tasks store
# (cmd/dama BenchmarkProgressStorage): 5 tasks reporting progress 50 times a
# second for DAMA_BENCH_WINDOW (60s), with progress_interval at its default
# and at 1ms (every line stored), as lines and events per minute and the
# database's growth.
#
# scripts/bench.sh logs [go test flags]: what keeping each attempt's log
# tail in the database costs (cmd/dama BenchmarkLogTail): 5 tasks writing
# their log as fast as a shell loop does for DAMA_BENCH_WINDOW (60s), with
# log_tail_bytes at its default and at -1 (none kept), as the output and
# the database's growth per minute, chunks written, and what each keeps.
#
# scripts/bench.sh keeper [go test flags]: one request and its reply
# between a task process and its lock keeper (internal/keeper
# BenchmarkStream), encoded and sent over a Unix socket pair, 5 runs.
#
# scripts/bench.sh cgroups [go test flags]: what a control group adds to an
# attempt (internal/cgroup BenchmarkStart, BenchmarkUsage; root): /bin/true
# launched plain and in a group of its own on cgroup v1 and on a cgroup2
# mount of its own, p50 of the launch and of the end, 5 runs; and 1,000
# groups each holding a sleeping process, the kernel memory they take and
# the time to read one group's usage.
#
# scripts/bench.sh memory [go test flags]: the memory of a running task by
# kind (cmd/sample-embedded): a function kind's, the sample ETL command's
# and a bare /bin/sleep's, DAMA_BENCH_TASKS (20) of each side by side, as
# the median RSS of their runners and of their commands' processes.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib-postgres.sh

if [ "${1:-}" = scale ]; then
	shift
	if [[ "${1:-}" =~ ^[0-9][0-9,]*$ ]]; then
		export DAMA_BENCH_SIZES=$1
		shift
	fi
	if [[ "${1:-}" =~ ^[a-z][a-z,]*$ ]]; then
		export DAMA_BENCH_MODES=$1
		shift
	fi
	dama_pg_install
	# Row mode at 500 holds over 1000 server connections (the server's
	# max_connections is set to fit), and the benchmark reads every process.
	ulimit -n "$(ulimit -Hn)"
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $("$(dama_pg_bindir)/postgres" --version)"
	# The benchmark's own deadlines end a stuck run, its processes and
	# servers cleaned up, long before go test's timeout, which would not.
	exec go test -run '^$' -bench Scale -benchtime 1x -count=1 -timeout 120m "$@" ./internal/scalebench
fi

if [ "${1:-}" = hosts ]; then
	shift
	if [[ "${1:-}" =~ ^[0-9][0-9,]*$ ]]; then
		export DAMA_BENCH_HOSTS=$1
		shift
		if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
			export DAMA_BENCH_HOSTS_N=$1
			shift
		fi
	fi
	[ "$(id -u)" -eq 0 ] || { echo "bench.sh hosts needs root (namespaces, nftables)" >&2; exit 1; }
	dama_pg_install
	ulimit -n "$(ulimit -Hn)"
	# A task takes some 15 pids (its task process's threads and its
	# command's): 2,263 of them took the kernel's default 32,768, and the
	# server could fork no backend.
	if [ "$(cat /proc/sys/kernel/pid_max)" -lt 4194304 ]; then
		echo "raising kernel.pid_max from $(cat /proc/sys/kernel/pid_max) to 4194304"
		echo 4194304 >/proc/sys/kernel/pid_max
	fi
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; kernel $(uname -r); $(go version); $("$(dama_pg_bindir)/postgres" --version); commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
	exec go test -run '^$' -bench Hosts -benchtime 1x -count=1 -timeout 120m "$@" ./internal/scalebench
fi

if [ "${1:-}" = keeper ]; then
	shift
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $(go version)"
	exec go test -run '^$' -bench Stream -count=5 "$@" ./internal/keeper
fi

if [ "${1:-}" = burst ]; then
	shift
	if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
		export DAMA_BENCH_BURST_N=$1
		shift
		if [[ "${1:-}" =~ ^[0-9]+$ ]]; then
			export DAMA_BENCH_BURST_W=$1
			shift
		fi
	fi
	dama_pg_install
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $("$(dama_pg_bindir)/postgres" --version)"
	exec go test -run '^$' -bench Burst -benchtime 1x -count=1 -timeout 60m "$@" ./internal/scalebench
fi

dama_pg_use TEST_DATABASE_URL

if [ "${1:-}" = storage ]; then
	shift
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $(psql "$TEST_DATABASE_URL" -AtqX -c 'SHOW server_version')"
	exec go test -run '^$' -bench ProgressStorage -benchtime 1x -count=1 -timeout 30m "$@" ./cmd/dama
fi

if [ "${1:-}" = logs ]; then
	shift
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $(psql "$TEST_DATABASE_URL" -AtqX -c 'SHOW server_version')"
	exec go test -run '^$' -bench LogTail -benchtime 1x -count=1 -timeout 30m "$@" ./cmd/dama
fi

if [ "${1:-}" = cgroups ]; then
	shift
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); kernel $(uname -r); $(go version)"
	exec go test -run '^$' -bench 'Start|Usage' -benchtime 300x -count=5 "$@" ./internal/cgroup
fi

if [ "${1:-}" = memory ]; then
	shift
	echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version)"
	exec go test -run '^$' -bench TaskMemory -benchtime 1x -count=3 "$@" ./cmd/sample-embedded
fi

echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GB; $(go version); $(psql "$TEST_DATABASE_URL" -AtqX -c 'SHOW server_version')"
go test -run '^$' -bench Latency -benchtime 300x -count=1 "$@" ./supervisor
