package supervisor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner"
)

// exampleFuncs are the functions of the examples' function kinds; the
// test binary registers them in TestMain, as a program's main would:
//
//	func main() {
//		funcs := taskrunner.Funcs{"sum": sum, "load": load}
//		if code, ok := supervisor.RunTaskProcess(context.Background(), funcs); ok {
//			os.Exit(code)
//		}
//		// ... supervisor.New(pool, cfg, supervisor.Options{Funcs: funcs, ...})
//	}
func exampleFuncs() taskrunner.Funcs {
	return taskrunner.Funcs{"sum": sum, "load": load}
}

// sum adds up its arguments' numbers, reporting its progress.
func sum(ctx context.Context, t *taskrunner.Task) error {
	var args struct {
		Numbers []int `json:"numbers"`
	}
	if err := t.DecodeArgs(&args); err != nil {
		return taskrunner.NoRetry(err)
	}
	total := 0
	for i, n := range args.Numbers {
		total += n
		if err := t.Progress(map[string]int{"step": i + 1, "of": len(args.Numbers)}); err != nil {
			return err
		}
	}
	return t.Event("total", map[string]int{"sum": total})
}

// load loads three batches, checkpointing after each; its first attempt
// fails after the second, and the next resumes from the checkpoint.
func load(ctx context.Context, t *taskrunner.Task) error {
	var cp struct {
		Next int `json:"next_batch"`
	}
	if _, err := t.DecodeLastCheckpoint(&cp); err != nil {
		return err
	}
	if err := t.Event("started", map[string]int{"attempt": t.Attempt(), "from_batch": cp.Next}); err != nil {
		return err
	}
	for batch := cp.Next; batch < 3; batch++ {
		if batch == 2 && t.Attempt() == 1 {
			return errors.New("the warehouse went away")
		}
		if err := t.Checkpoint(map[string]int{"next_batch": batch + 1}); err != nil {
			return err
		}
	}
	return nil
}

// runExample runs a supervisor on yaml's kinds until the task submitted
// with args is finished, and prints its status and events.
func runExample(yaml, kind, args string) {
	env, done := testenv.ForExample()
	defer done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg, err := config.Load(env.WriteConfig(yaml))
	if err != nil {
		panic(err)
	}
	sup, err := supervisor.New(env.Pool, cfg, supervisor.Options{
		DatabaseURL: env.URL,
		// No Executable: the task processes are this program again.
		Funcs:  exampleFuncs(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		panic(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- sup.Run(ctx) }()

	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		panic(err)
	}
	id, _, err := client.Submit(ctx, dama.SubmitParams{Kind: kind, Args: []byte(args)})
	if err != nil {
		panic(err)
	}
	waitCtx, stopWaiting := context.WithTimeout(ctx, time.Minute)
	defer stopWaiting()
	c, err := client.Wait(waitCtx, id)
	if err != nil {
		panic(err)
	}
	fmt.Println(c.Status, "at attempt", c.Attempt)
	events, err := env.Pool.Query(ctx, `
		SELECT attempt, type, payload FROM data_manager.event_store
		 WHERE etl_context_id = $1 ORDER BY event_id`, id)
	if err != nil {
		panic(err)
	}
	var (
		attempt int
		typ     string
		payload []byte
	)
	if _, err := pgx.ForEachRow(events, []any{&attempt, &typ, &payload}, func() error {
		shown := string(payload)
		if typ == kind+":ERROR" {
			// Its payload also holds the log's tail, with pids and times.
			var failed struct {
				Reason string `json:"reason"`
			}
			if err := json.Unmarshal(payload, &failed); err != nil {
				return err
			}
			shown = "reason: " + failed.Reason
		}
		fmt.Println(attempt, typ, shown)
		return nil
	}); err != nil {
		panic(err)
	}
	cancel()
	if err := <-stopped; err != nil {
		panic(err)
	}
}

// A function kind names a Go function that the program embedding the
// supervisor registers. Its task runs in a process of its own, this
// program started again, holding the task's lock like a command's.
//
// Progress is sampled: the first PROGRESS is stored at once, those that
// follow within progress_interval (10s) wait, each replacing the last, and
// the newest is stored when the interval is up or, as here, before the
// outcome.
func ExampleRunTaskProcess() {
	runExample(`
log_dir: {{dir}}/logs
kinds:
  sum:
    function: sum
`, "sum", `{"numbers": [1, 2, 3]}`)
	// Output:
	// DONE at attempt 1
	// 0 sum:INITIAL {"numbers": [1, 2, 3]}
	// 1 sum:PROGRESS {"of": 3, "step": 1}
	// 1 sum:TOTAL {"sum": 6}
	// 1 sum:PROGRESS {"of": 3, "step": 3}
	// 1 sum:FINAL {"exit_code": 0}
}

// A function that fails is retried under its kind's retry policy; the next
// attempt resumes from the last checkpoint.
func ExampleRunTaskProcess_resume() {
	runExample(`
log_dir: {{dir}}/logs
kinds:
  load:
    function: load
    retry: {delay: 100ms, backoff: fixed}
`, "load", `{}`)
	// Output:
	// DONE at attempt 2
	// 0 load:INITIAL {}
	// 1 load:STARTED {"attempt": 1, "from_batch": 0}
	// 1 load:CHECKPOINT {"next_batch": 1}
	// 1 load:CHECKPOINT {"next_batch": 2}
	// 1 load:ERROR reason: the warehouse went away
	// 2 load:STARTED {"attempt": 2, "from_batch": 2}
	// 2 load:CHECKPOINT {"next_batch": 3}
	// 2 load:FINAL {"exit_code": 0}
}
