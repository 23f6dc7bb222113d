// Command sample-etl is a small ETL task for dama's demo and tests, and an
// example of a task's own Go program (package task). It works through a
// number of steps, reports progress and a checkpoint after each on the
// events pipe, and on a retry resumes after the last checkpoint.
//
// Its arguments are a JSON object:
//
//	steps       number of steps (default 10)
//	step_ms     milliseconds each step takes (default 100)
//	fail_at     exit 3 when reaching this step, on the first attempt only
//	starts_dir  append "<pid> <attempt> <first step>" to <starts_dir>/<etl_context_id>.starts at every start
//	log_steps   write a line to the log at every step
//	until_file  after the last step, wait until this file exists (an hour at most) before finishing
//
// Its arguments name paths it writes and looks at, as the kind's user: it
// is a program for demos and tests, not for a kind that runs as a
// privileged user.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dama-etl/dama/task"
)

type args struct {
	Steps     int    `json:"steps"`
	StepMS    int    `json:"step_ms"`
	FailAt    int    `json:"fail_at"`
	StartsDir string `json:"starts_dir"`
	LogSteps  bool   `json:"log_steps"`
	UntilFile string `json:"until_file"`
}

type checkpoint struct {
	NextStep int `json:"next_step"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sample-etl:", err)
		os.Exit(1)
	}
}

func run() error {
	t, err := task.FromEnv()
	if err != nil {
		return err
	}
	a := args{Steps: 10, StepMS: 100}
	if err := t.DecodeArgs(&a); err != nil {
		return err
	}
	var cp checkpoint
	if _, err := t.DecodeLastCheckpoint(&cp); err != nil {
		return err
	}

	if a.StartsDir != "" {
		f, err := os.OpenFile(filepath.Join(a.StartsDir, strconv.FormatInt(t.ID(), 10)+".starts"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintf(f, "%d %d %d\n", os.Getpid(), t.Attempt(), cp.NextStep)
		f.Close()
	}
	fmt.Printf("context %d attempt %d: steps %d to %d\n", t.ID(), t.Attempt(), cp.NextStep, a.Steps)

	for step := cp.NextStep; step < a.Steps; step++ {
		if a.FailAt > 0 && step == a.FailAt && t.Attempt() <= 1 {
			fmt.Fprintf(os.Stderr, "failing at step %d as asked\n", step)
			os.Exit(3)
		}
		time.Sleep(time.Duration(a.StepMS) * time.Millisecond)
		if a.LogSteps {
			fmt.Printf("step %d/%d\n", step+1, a.Steps)
		}
		if err := t.Progress(map[string]int{"step": step + 1, "of": a.Steps}); err != nil {
			return err
		}
		if err := t.Checkpoint(checkpoint{NextStep: step + 1}); err != nil {
			return err
		}
	}
	// A test ends the wait when it is done looking, however slow the
	// machine; an hour at most, should it die first.
	for deadline := time.Now().Add(time.Hour); a.UntilFile != ""; time.Sleep(50 * time.Millisecond) {
		if _, err := os.Stat(a.UntilFile); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not appear within %s", a.UntilFile, time.Hour)
		}
	}
	if err := t.Event("rows_loaded", map[string]int{"rows": a.Steps * 1000}); err != nil {
		return err
	}
	fmt.Printf("context %d done\n", t.ID())
	return nil
}
