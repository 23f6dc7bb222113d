// Command sample-embedded is a Go program that embeds the dama supervisor
// and runs its ETL steps as Go functions instead of commands: the kinds of
// its configuration name functions it registers (`function: copy_rows`),
// and each task runs in a process of its own, this program started again,
// with the same lock, fencing, resume and adoption as a command's.
//
//	DATABASE_URL=postgres://... sample-embedded --config dama.yaml
//
// migrates the database and runs the supervisor until SIGINT or SIGTERM;
// the tasks it started run on, and the next supervisor adopts them. Submit
// tasks with `dama submit copy_rows --args '{"rows": 20}'` on the same
// configuration, with dama.Client, or from SQL's point of view with
// nothing else: dama's views show them like any other.
//
// Its functions:
//
//	copy_rows  copies args.rows rows (default 10), args.step_ms each
//	           (default 100), reporting progress and a checkpoint after each
//	           and resuming from the last checkpoint on a retry. On the first
//	           attempt only, args.fail_at fails at that row (for good with
//	           args.fail_for_good) and args.panic_at panics there;
//	           args.ignore_cancel makes it sleep through cancellation.
//	           args.starts_dir appends "<pid> <attempt> <first row>" to
//	           <starts_dir>/<etl_context_id>.starts at every start;
//	           args.env_file gets the environment of a process it starts;
//	           after the last row it waits until args.until_file exists
//	           (an hour at most). Its arguments name paths it writes and
//	           looks at: a program for demos and tests, not for a kind of a
//	           privileged user.
//	fan_out    submits args.parts copy_rows children of args.rows rows; its
//	           kind sets await_children, so it is DONE when they all are.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/sql"
	"github.com/dama-etl/dama/supervisor"
	"github.com/dama-etl/dama/taskrunner"
)

func main() {
	funcs := taskrunner.Funcs{
		"copy_rows": copyRows,
		"fan_out":   fanOut,
	}
	// First thing: started by the supervisor as a task process, this
	// program runs the task and exits here.
	if code, ok := supervisor.RunTaskProcess(context.Background(), funcs); ok {
		os.Exit(code)
	}
	configPath := flag.String("config", os.Getenv("DAMA_CONFIG"), "configuration file (default $DAMA_CONFIG)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *configPath, funcs); err != nil {
		fmt.Fprintln(os.Stderr, "sample-embedded:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, configPath string, funcs taskrunner.Funcs) error {
	cfg, err := config.Load(configPath)
	if err != nil {
		return err
	}
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		return errors.New("DATABASE_URL is not set")
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parse DATABASE_URL: %w", err)
	}
	// As many connections as `dama supervisor` uses: steps, River's
	// producers and its completer each need one.
	pcfg.MaxConns = 20
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := sql.Migrate(ctx, pool, logger); err != nil {
		return err
	}
	s, err := supervisor.New(pool, cfg, supervisor.Options{
		DatabaseURL: url,
		Funcs:       funcs,
		Logger:      logger,
	})
	if err != nil {
		return err
	}
	return s.Run(ctx)
}

type copyArgs struct {
	Rows         int    `json:"rows"`
	StepMS       int    `json:"step_ms"`
	FailAt       int    `json:"fail_at"`
	FailForGood  bool   `json:"fail_for_good"`
	PanicAt      int    `json:"panic_at"`
	IgnoreCancel bool   `json:"ignore_cancel"`
	StartsDir    string `json:"starts_dir"`
	EnvFile      string `json:"env_file"`
	UntilFile    string `json:"until_file"`
}

type copyCheckpoint struct {
	NextRow int `json:"next_row"`
}

// copyRows is a function kind's body: it resumes from the last checkpoint,
// reports progress, and returns when its rows are copied.
func copyRows(ctx context.Context, t *taskrunner.Task) error {
	a := copyArgs{Rows: 10, StepMS: 100}
	if err := t.DecodeArgs(&a); err != nil {
		return taskrunner.NoRetry(err) // another attempt would not decode them either
	}
	var cp copyCheckpoint
	resumed, err := t.DecodeLastCheckpoint(&cp)
	if err != nil {
		return err
	}
	if a.StartsDir != "" {
		if err := recordStart(a.StartsDir, t, cp.NextRow); err != nil {
			return err
		}
	}
	if resumed {
		t.Logger().Info("resuming", "next_row", cp.NextRow)
	}
	if a.EnvFile != "" {
		// What a process the function starts gets of dama's environment.
		out, err := exec.CommandContext(ctx, "/usr/bin/env").Output()
		if err != nil {
			return err
		}
		if err := os.WriteFile(a.EnvFile, out, 0o644); err != nil {
			return err
		}
	}
	step := time.Duration(a.StepMS) * time.Millisecond
	for row := cp.NextRow; row < a.Rows; row++ {
		if a.IgnoreCancel {
			time.Sleep(step)
		} else {
			select {
			case <-ctx.Done():
				return fmt.Errorf("stopped at row %d: %w", row, ctx.Err())
			case <-time.After(step):
			}
		}
		if t.Attempt() == 1 {
			switch row + 1 {
			case a.FailAt:
				err := fmt.Errorf("source connection reset at row %d", row+1)
				if a.FailForGood {
					return taskrunner.NoRetry(err)
				}
				return err
			case a.PanicAt:
				panic(fmt.Sprintf("row %d: unexpected NULL", row+1))
			}
		}
		if err := t.Progress(map[string]int{"step": row + 1, "of": a.Rows}); err != nil {
			return err
		}
		if err := t.Checkpoint(copyCheckpoint{NextRow: row + 1}); err != nil {
			return err
		}
	}
	// A test ends the wait when it is done looking; an hour at most,
	// should it die first.
	wctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	for a.UntilFile != "" {
		if _, err := os.Stat(a.UntilFile); err == nil {
			break
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("stopped waiting for %s: %w", a.UntilFile, wctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	return t.Event("rows_copied", map[string]any{"rows": a.Rows, "resumed_from": cp.NextRow})
}

func recordStart(dir string, t *taskrunner.Task, first int) error {
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%d.starts", t.ID())), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintf(f, "%d %d %d\n", os.Getpid(), t.Attempt(), first)
	return err
}

// fanOut submits its parts as children, under idempotency keys: a retry
// submits the same children again, not new ones.
func fanOut(ctx context.Context, t *taskrunner.Task) error {
	var a struct {
		Parts int `json:"parts"`
		Rows  int `json:"rows"`
	}
	if err := t.DecodeArgs(&a); err != nil {
		return taskrunner.NoRetry(err)
	}
	for i := range a.Parts {
		if err := t.Submit("copy_rows", map[string]int{"rows": a.Rows, "step_ms": 50}, fmt.Sprintf("part-%d", i)); err != nil {
			return err
		}
	}
	return nil
}
