package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

const sampleConfig = `
log_dir: {{dir}}/logs
poll_interval: 500ms
heartbeat_interval: 200ms
kill_grace: 1s
progress_interval: 100ms
queues:
  etl: { max_running: %d }
kinds:
  sample:
    queue: etl
    command: ["{{sample}}"]
    max_attempts: 3
`

type world struct {
	*testenv.Env
	cfg       string
	startsDir string
}

func sampleConfigFor(maxRunning int) string { return fmt.Sprintf(sampleConfig, maxRunning) }

func newWorld(t *testing.T, maxRunning int) *world {
	env := testenv.New(t)
	w := &world{Env: env, cfg: env.WriteConfig(sampleConfigFor(maxRunning)), startsDir: filepath.Join(env.Dir, "starts")}
	if err := os.MkdirAll(w.startsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return w
}

// submit submits a sample task that records its starts, and returns its id.
func (w *world) submit(steps, stepMS int) int64 {
	w.T.Helper()
	return w.submitSample(map[string]any{"steps": steps, "step_ms": stepMS, "starts_dir": w.startsDir})
}

// submitHeld is submit for a task that, after its steps, runs on until the
// test calls release: what the test must see running stays running
// however slow the machine.
func (w *world) submitHeld(steps, stepMS int) int64 {
	w.T.Helper()
	return w.submitSample(map[string]any{"steps": steps, "step_ms": stepMS, "starts_dir": w.startsDir, "until_file": w.releaseFile()})
}

// release lets the held tasks finish.
func (w *world) release() {
	w.T.Helper()
	if err := os.WriteFile(w.releaseFile(), nil, 0o644); err != nil {
		w.T.Fatal(err)
	}
}

func (w *world) releaseFile() string { return filepath.Join(w.Dir, "release") }

func (w *world) submitSample(args map[string]any) int64 {
	w.T.Helper()
	b, _ := json.Marshal(args)
	res := w.Dama(w.cfg, "submit", "sample", "--args", string(b))
	if res.Code != 0 {
		w.T.Fatalf("submit: exit %d: %s", res.Code, res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// submitOf submits a task of kind with dama submit's other arguments,
// and returns its id.
func (w *world) submitOf(kind string, args ...string) int64 {
	w.T.Helper()
	res := w.Dama(w.cfg, append([]string{"submit", kind}, args...)...)
	if res.Code != 0 {
		w.T.Fatalf("submit %s: exit %d: %s", kind, res.Code, res.Stderr)
	}
	return testenv.Atoi(w.T, res.Stdout)
}

// waiterKind is the configuration of a kind "waiter" whose command runs
// until the file goFile exists.
func waiterKind(goFile string, maxAttempts int) string {
	return fmt.Sprintf(`
  waiter:
    command: ["/bin/sh", "-c", "while [ ! -e %s ]; do sleep 0.2; done"]
    max_attempts: %d
`, goFile, maxAttempts)
}

func (w *world) task(id int64) etlcontext.Task {
	w.T.Helper()
	return w.Task(id)
}

func (w *world) waitFor(id int64, timeout time.Duration, what string, cond func(etlcontext.Task) bool) etlcontext.Task {
	w.T.Helper()
	return w.WaitForTask(id, timeout, what, cond)
}

func (w *world) waitRunning(id int64) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, 30*time.Second, "to run holding its lock", func(t etlcontext.Task) bool {
		return t.Status == etlcontext.StatusRunning && t.PID != nil && t.InitialEventLocked
	})
}

// waitSettled waits until the context is finished and its River job agrees.
func (w *world) waitSettled(id int64, timeout time.Duration) etlcontext.Task {
	w.T.Helper()
	return w.waitFor(id, timeout, "to finish with its job settled", func(t etlcontext.Task) bool {
		if !t.Status.Finished() || t.JobState == nil {
			return false
		}
		want := map[etlcontext.Status]string{etlcontext.StatusDone: "completed", etlcontext.StatusFailed: "discarded", etlcontext.StatusCancelled: "cancelled"}
		return *t.JobState == want[t.Status]
	})
}

// starts returns the lines the sample task wrote at each of its starts:
// "<pid> <attempt> <first step>".
func (w *world) starts(id int64) [][]string {
	w.T.Helper()
	data, err := os.ReadFile(filepath.Join(w.startsDir, strconv.FormatInt(id, 10)+".starts"))
	if err != nil && !os.IsNotExist(err) {
		w.T.Fatal(err)
	}
	var out [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		if line != "" {
			out = append(out, strings.Fields(line))
		}
	}
	return out
}
