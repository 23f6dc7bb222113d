// Command sample-etl is a small ETL task for dama's demo and tests. It works
// through a number of steps, reports progress and a checkpoint after each on
// the events pipe (DAMA_EVENTS_FD), and on a retry resumes after the last
// checkpoint (DAMA_CHECKPOINT).
//
// Its arguments (DAMA_ARGS) are a JSON object:
//
//	steps       number of steps (default 10)
//	step_ms     milliseconds each step takes (default 100)
//	fail_at     exit 3 when reaching this step, on the first attempt only
//	starts_dir  append "<pid> <attempt> <first step>" to <starts_dir>/<etl_context_id>.starts at every start
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

type args struct {
	Steps     int    `json:"steps"`
	StepMS    int    `json:"step_ms"`
	FailAt    int    `json:"fail_at"`
	StartsDir string `json:"starts_dir"`
	// LogSteps writes a line to the log at every step.
	LogSteps bool `json:"log_steps"`
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
	a := args{Steps: 10, StepMS: 100}
	if s := os.Getenv("DAMA_ARGS"); s != "" && s != "null" {
		if err := json.Unmarshal([]byte(s), &a); err != nil {
			return fmt.Errorf("DAMA_ARGS: %w", err)
		}
	}
	var cp checkpoint
	if s := os.Getenv("DAMA_CHECKPOINT"); s != "" {
		if err := json.Unmarshal([]byte(s), &cp); err != nil {
			return fmt.Errorf("DAMA_CHECKPOINT: %w", err)
		}
	}
	attempt, _ := strconv.Atoi(os.Getenv("DAMA_ATTEMPT"))
	id := os.Getenv("DAMA_ETL_CONTEXT_ID")

	events := os.Stdout
	if fd, err := strconv.Atoi(os.Getenv("DAMA_EVENTS_FD")); err == nil {
		events = os.NewFile(uintptr(fd), "events")
	}
	enc := json.NewEncoder(events)
	report := func(typ string, payload any) error {
		return enc.Encode(map[string]any{"type": typ, "payload": payload})
	}

	if a.StartsDir != "" {
		f, err := os.OpenFile(filepath.Join(a.StartsDir, id+".starts"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return err
		}
		fmt.Fprintf(f, "%d %d %d\n", os.Getpid(), attempt, cp.NextStep)
		f.Close()
	}
	fmt.Printf("context %s attempt %d: steps %d to %d\n", id, attempt, cp.NextStep, a.Steps)

	for step := cp.NextStep; step < a.Steps; step++ {
		if a.FailAt > 0 && step == a.FailAt && attempt <= 1 {
			fmt.Fprintf(os.Stderr, "failing at step %d as asked\n", step)
			os.Exit(3)
		}
		time.Sleep(time.Duration(a.StepMS) * time.Millisecond)
		if a.LogSteps {
			fmt.Printf("step %d/%d\n", step+1, a.Steps)
		}
		if err := report("progress", map[string]int{"step": step + 1, "of": a.Steps}); err != nil {
			return err
		}
		if err := report("checkpoint", checkpoint{NextStep: step + 1}); err != nil {
			return err
		}
	}
	if err := report("rows_loaded", map[string]int{"rows": a.Steps * 1000}); err != nil {
		return err
	}
	fmt.Printf("context %s done\n", id)
	return nil
}
