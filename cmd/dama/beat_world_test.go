package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// beatScript is a task that forks: a background worker, which ignores
// SIGTERM, writes "<attempt> <unix ns>" to beats-<id> every 50ms for as
// long as it lives. The first attempt reports a checkpoint and waits for its
// worker forever; later attempts record the checkpoint they got, beat for a
// second and exit 0.
const beatScript = `
beats={{dir}}/beats-$DAMA_ETL_CONTEXT_ID
echo "$DAMA_ATTEMPT $$ $(date +%s%N) ${DAMA_CHECKPOINT:-none}" >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID
if [ "$DAMA_ATTEMPT" = 1 ]; then
	echo '{"type":"checkpoint","payload":{"step":5}}' >&3
	(trap '' TERM; while :; do echo "1 $(date +%s%N)" >> "$beats"; sleep 0.05; done) &
	wait
else
	for i in 1 2 3 4 5 6 7 8 9 10; do echo "$DAMA_ATTEMPT $(date +%s%N)" >> "$beats"; sleep 0.1; done
fi
`

type beatWorld struct {
	*testenv.Env
	cfg string
}

func newBeatWorld(t *testing.T, env *testenv.Env, extra string) *beatWorld {
	script := filepath.Join(env.Dir, "beat.sh")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(beatScript, "{{dir}}", env.Dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 1s
` + extra + `
kinds:
  beat:
    command: ["/bin/sh", "{{dir}}/beat.sh"]
    max_attempts: 3
`)
	return &beatWorld{Env: env, cfg: cfg}
}

func (w *beatWorld) submit() int64 {
	w.T.Helper()
	res := w.Dama(w.cfg, "submit", "beat")
	if res.Code != 0 {
		w.T.Fatalf("submit: %s", res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// beats returns, per attempt, the times its processes wrote.
func (w *beatWorld) beats(id int64) map[int][]int64 {
	data, _ := os.ReadFile(filepath.Join(w.Dir, fmt.Sprintf("beats-%d", id)))
	out := map[int][]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		a, _ := strconv.Atoi(f[0])
		ns, _ := strconv.ParseInt(f[1], 10, 64)
		out[a] = append(out[a], ns)
	}
	return out
}

// starts returns the lines "<attempt> <pid> <unix ns> <checkpoint>".
func (w *beatWorld) starts(id int64) [][]string {
	data, _ := os.ReadFile(filepath.Join(w.Dir, fmt.Sprintf("starts-%d", id)))
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			out = append(out, strings.Fields(line))
		}
	}
	return out
}

// killRunnerAndSettle SIGKILLs the task process pid of context id and waits
// for the task to finish DONE by a second attempt; it returns when the kill
// was sent and the settled task.
func (w *beatWorld) killRunnerAndSettle(t *testing.T, id int64, pid int) (killedAt int64, got etlcontext.Task) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt = time.Now().UnixNano()
	got = (&world{Env: w.Env}).waitSettled(id, 3*time.Minute)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	return killedAt, got
}

// assertNoOverlap fails unless every process of each attempt wrote its last
// beat before the next attempt started, by the times the commands wrote.
func (w *beatWorld) assertNoOverlap(t *testing.T, id int64) {
	t.Helper()
	beats := w.beats(id)
	for _, s := range w.starts(id) {
		attempt, _ := strconv.Atoi(s[0])
		started, _ := strconv.ParseInt(s[2], 10, 64)
		for prev := 1; prev < attempt; prev++ {
			if n := len(beats[prev]); n > 0 && slices.Max(beats[prev]) >= started {
				t.Errorf("context %d: attempt %d wrote %s after attempt %d started",
					id, prev, time.Duration(slices.Max(beats[prev])-started), attempt)
			}
		}
	}
}
