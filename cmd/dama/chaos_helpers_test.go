package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shirou/gopsutil/v3/process"

	"github.com/dama-etl/dama/internal/hostproc"
	"github.com/dama-etl/dama/internal/testenv"
)

// chaosScript is a task that forks, like beatScript, but whose every attempt
// finishes by itself: it records its start ("<attempt> <pid> <unix ns>
// <checkpoint>"), reports a checkpoint naming its attempt, and waits for a
// background worker which ignores SIGTERM and writes "<attempt> <unix ns>"
// to beats-<id> 40 times, 50ms apart, then exits.
const chaosScript = `
beats={{dir}}/beats-$DAMA_ETL_CONTEXT_ID
echo "$DAMA_ATTEMPT $$ $(date +%s%N) ${DAMA_CHECKPOINT:-none}" >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID
echo "{\"type\":\"checkpoint\",\"payload\":{\"attempt\":$DAMA_ATTEMPT}}" >&3
(
	trap '' TERM
	i=0
	while [ $i -lt 40 ]; do
		echo "$DAMA_ATTEMPT $(date +%s%N)" >> "$beats"
		i=$((i + 1))
		sleep 0.05
	done
) &
wait
`

// Chaos parameters. A restart keeps the server down for less than
// reconnect_grace: no task process gives up on its lock, and no attempt may
// fail for it, unless pg_ctl's own stop and start made the outage, as
// measured, longer (then it counts as a long outage). An outage keeps it
// down for longer than a task process's detection, reconnect_grace and
// kill_grace together: every command still running is stopped while the
// server is away, and its attempt fails.
const (
	chaosTasks          = 30
	chaosRounds         = 14
	chaosRoundGap       = 1500 * time.Millisecond
	chaosReconnectGrace = 7 * time.Second
	// chaosRelockSlack is the time a task process may take, after the
	// server is back, to take its lock again, besides making its two
	// connections (measured at the time: see relockSlack): its lock's
	// retries are 500 ms apart, its writer's a second.
	chaosRelockSlack = 2 * time.Second
	chaosMinRestart  = time.Second
	// With pg_ctl's own second or so on an idle machine, a restart stays
	// within the grace less the slack: one that spends no attempt.
	chaosMaxRestart = 4 * time.Second
	chaosOutage     = 10 * time.Second
	chaosMaxOutages = 2
	// A task that failed this many attempts is spared further faults:
	// River backs off errors^4 seconds (1s, 16s, then 81s), and the test
	// must end within a few minutes.
	chaosMaxFailures = 2
)

const chaosConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 1s
reconnect_grace: %s
queues:
  etl: { max_running: 4 }
kinds:
  chaos:
    queue: etl
    command: ["/bin/sh", "{{dir}}/chaos.sh"]
    max_attempts: 10
`

// chaosAttempt names one attempt of one context.
type chaosAttempt struct {
	id      int64
	attempt int
}

// checkNoOverlap fails unless every beat of each attempt was written before
// any later attempt started, by the times the commands wrote (the logic of
// beatWorld.assertNoOverlap, for starts and beats already read).
func checkNoOverlap(t *testing.T, seed uint64, id int64, starts [][]string, beats map[int][]int64) bool {
	t.Helper()
	ok := true
	for _, s := range starts {
		attempt, _ := strconv.Atoi(s[0])
		started, _ := strconv.ParseInt(s[2], 10, 64)
		for prev := range beats {
			if prev >= attempt || len(beats[prev]) == 0 {
				continue
			}
			if last := slices.Max(beats[prev]); last >= started {
				ok = false
				t.Errorf("seed %d: context %d: attempt %d wrote %s after attempt %d started",
					seed, id, prev, time.Duration(last-started), attempt)
			}
		}
	}
	return ok
}

// beatSpans summarises beats: per attempt, how many and from when to when.
func beatSpans(beats map[int][]int64) map[int]string {
	out := map[int]string{}
	for a, b := range beats {
		out[a] = fmt.Sprintf("%d beats %d..%d", len(b), slices.Min(b), slices.Max(b))
	}
	return out
}

// isTaskrunner reports whether pid, started at ticks, is alive: the task
// process recorded with them (and not a process that reused the pid of a
// dead one).
func isTaskrunner(pid int, ticks uint64) bool {
	alive, err := hostproc.Alive(pid, ticks)
	return err == nil && alive && ticks != 0
}

// attemptProcesses lists the live processes that carry the run id of an
// attempt of the test whose processes carry tag (testenv.Env.Tag).
func attemptProcesses(tag string) []string {
	procs, err := process.Processes()
	if err != nil {
		return []string{"list processes: " + err.Error()}
	}
	var out []string
	for _, p := range procs {
		env, err := p.Environ()
		if err != nil || !slices.Contains(env, tag) {
			continue
		}
		for _, kv := range env {
			if strings.HasPrefix(kv, "DAMA_RUN_ID=") && testenv.Alive(int(p.Pid)) {
				cmdline, _ := p.Cmdline()
				out = append(out, fmt.Sprintf("%d %q %s", p.Pid, cmdline, kv))
				break
			}
		}
	}
	sort.Strings(out)
	return out
}

// beatSizes returns the size of each context's beats file.
func beatSizes(dir string, ids []int64) map[int64]int64 {
	out := map[int64]int64{}
	for _, id := range ids {
		if fi, err := os.Stat(filepath.Join(dir, fmt.Sprintf("beats-%d", id))); err == nil {
			out[id] = fi.Size()
		}
	}
	return out
}

// chaosEvents lists the events of context id, one a line, for a failure's
// report: what the database recorded, and when by its clock.
func chaosEvents(pool *pgxpool.Pool, id int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out string
	err := pool.QueryRow(ctx, `
		SELECT coalesce(string_agg(format('%s %s attempt %s run %s %s', to_char(created_at, 'HH24:MI:SS.MS'), type, attempt, run_id, coalesce(payload::text, '')), E'\n' ORDER BY event_id), '')
		  FROM data_manager.event_store WHERE etl_context_id = $1`, id).Scan(&out)
	if err != nil {
		return fmt.Sprintf("(events not read: %v)", err)
	}
	return out
}
