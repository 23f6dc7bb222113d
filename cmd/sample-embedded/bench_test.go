package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/scalebench"
	"github.com/dama-etl/dama/internal/testenv"
)

// benchConfig runs, side by side under one supervisor of sample-embedded,
// tasks of a function kind, of the sample ETL command, and of a bare
// /bin/sleep: the last is the floor a task process costs.
const benchConfig = `
log_dir: {{dir}}/logs
poll_interval: 1s
lock_mode: advisory
queues:
  bench: { max_running: 1000 }
kinds:
  function:
    queue: bench
    function: copy_rows
  command:
    queue: bench
    command: ["{{sample}}"]
  sleep:
    queue: bench
    command: ["/bin/sleep", "600"]
`

// BenchmarkTaskMemory measures the memory a running task costs by kind
// (DAMA_BENCH_TASKS of each, default 20): the median RSS and PSS of its
// runner and of its command's process, which for a function kind is the program again.
// It is run by scripts/bench.sh memory.
func BenchmarkTaskMemory(b *testing.B) {
	n := 20
	if s := os.Getenv("DAMA_BENCH_TASKS"); s != "" {
		var err error
		if n, err = strconv.Atoi(s); err != nil {
			b.Fatalf("DAMA_BENCH_TASKS %q: %v", s, err)
		}
	}
	env := testenv.New(b)
	cfg := env.WriteConfig(benchConfig)
	env.StartProgram(env.SampleEmbedded, cfg, "supervisor")
	args := map[string]string{
		"function": `{"rows": 100000, "step_ms": 1000}`,
		"command":  `{"steps": 100000, "step_ms": 1000}`,
		"sleep":    `{}`,
	}
	ids := map[string][]int64{}
	for _, kind := range []string{"function", "command", "sleep"} {
		for range n {
			res := env.Dama(cfg, "submit", kind, "--args", args[kind])
			if res.Code != 0 {
				b.Fatalf("submit %s: %s", kind, res.Stderr)
			}
			ids[kind] = append(ids[kind], testenv.Atoi(b, res.Stdout))
		}
	}
	ctx := context.Background()
	testenv.Eventually(b, 5*time.Minute, "every task to run its command", func() (bool, error) {
		tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{Limit: 3 * n})
		if err != nil {
			return false, err
		}
		running := 0
		for _, t := range tasks {
			if t.Status == etlcontext.StatusRunning && t.CommandPGID != nil {
				running++
			}
		}
		return running == 3*n, fmt.Errorf("%d of %d running", running, 3*n)
	})
	// The function processes reach their steady state within a few of
	// their steps, a second each: the measure waits until every task that
	// steps (all but the sleeps) reported its fifth, which its context
	// shows within a second.
	const steadyStep = 5
	testenv.Eventually(b, time.Minute, fmt.Sprintf("every stepping task to report step %d", steadyStep), func() (bool, error) {
		tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{Limit: 3 * n})
		if err != nil {
			return false, err
		}
		reached := 0
		for _, t := range tasks {
			var p struct{ Step int }
			if t.Kind != "sleep" && json.Unmarshal(t.Progress, &p) == nil && p.Step >= steadyStep {
				reached++
			}
		}
		return reached == 2*n, fmt.Errorf("%d of %d at step %d", reached, 2*n, steadyStep)
	})
	b.ResetTimer()
	for _, kind := range []string{"function", "command", "sleep"} {
		var runners, runnersPSS, commands, commandsPSS []float64
		for _, id := range ids[kind] {
			tasks, err := etlcontext.Tasks(ctx, env.Pool, etlcontext.TaskQuery{ID: id})
			if err != nil || len(tasks) != 1 || tasks[0].PID == nil || tasks[0].CommandPGID == nil {
				b.Fatalf("task %d: %v", id, err)
			}
			runners = append(runners, memMB(b, scalebench.RSS, *tasks[0].PID))
			runnersPSS = append(runnersPSS, memMB(b, scalebench.PSS, *tasks[0].PID))
			commands = append(commands, memMB(b, scalebench.RSS, *tasks[0].CommandPGID))
			commandsPSS = append(commandsPSS, memMB(b, scalebench.PSS, *tasks[0].CommandPGID))
		}
		b.ReportMetric(scalebench.Median(runners), kind+"-runner-MB")
		b.ReportMetric(scalebench.Median(runnersPSS), kind+"-runner-PSS-MB")
		b.ReportMetric(scalebench.Median(commands), kind+"-command-MB")
		b.ReportMetric(scalebench.Median(commandsPSS), kind+"-command-PSS-MB")
	}
}

// memMB reads a process's memory in MB by read (scalebench.RSS or PSS).
func memMB(b *testing.B, read func(int) (int64, error), pid int) float64 {
	n, err := read(pid)
	if err != nil {
		b.Fatalf("memory of pid %d: %v", pid, err)
	}
	return float64(n) / 1e6
}
