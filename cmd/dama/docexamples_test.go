package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// The task examples of docs/tasks.md (docs/examples/task.py and task.sh)
// run as written, each as a kind: an attempt that stops at a file it
// cannot read FAILS with the files before it done and checkpointed; once
// the file is fixed, dama retry resumes after them, to DONE, without
// loading one twice; and a missing file fails the task for good, with its
// reason, whatever attempts remain.
func TestTheTaskExamplesRun(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	examples, err := filepath.Abs(filepath.Join("..", "..", "docs", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("no python3: %v", err)
	}
	if _, err := exec.LookPath("jq"); err != nil {
		t.Fatalf("no jq (scripts/test.sh installs Debian's): %v", err)
	}
	cfg := env.WriteConfig(fmt.Sprintf(`
log_dir: {{dir}}/logs
poll_interval: 300ms
progress_interval: 100ms
kinds:
  load_py: { command: [%[1]q, %[2]q], max_attempts: 1 }
  load_sh: { command: [%[3]q], max_attempts: 1 }
  load_py_again: { command: [%[1]q, %[2]q], max_attempts: 3 }
  load_sh_again: { command: [%[3]q], max_attempts: 3 }
`, python, filepath.Join(examples, "task.py"), filepath.Join(examples, "task.sh")))
	w := &world{Env: env, cfg: cfg}
	env.Start(cfg, "supervisor")

	for _, lang := range []string{"py", "sh"} {
		t.Run(lang, func(t *testing.T) {
			dir := filepath.Join(env.Dir, lang)
			if err := os.MkdirAll(filepath.Join(dir, "c's file.csv"), 0o755); err != nil { // a directory: cannot be read
				t.Fatal(err)
			}
			files := []string{filepath.Join(dir, "a.csv"), filepath.Join(dir, "b.csv"), filepath.Join(dir, "c's file.csv"), filepath.Join(dir, "d.csv")}
			for i, rows := range map[int]int{0: 3, 1: 5, 3: 2} {
				if err := os.WriteFile(files[i], []byte(strings.Repeat("row\n", rows)), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			args, _ := json.Marshal(map[string]any{"files": files})
			id := w.submitOf("load_"+lang, "--args", string(args))
			if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusFailed {
				t.Fatalf("the first attempt, stopped by a directory: %s, want FAILED", got.Status)
			}
			if err := os.Remove(files[2]); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(files[2], []byte(strings.Repeat("row\n", 4)), 0o644); err != nil {
				t.Fatal(err)
			}
			if res := env.Dama(cfg, "retry", strconv.FormatInt(id, 10)); res.Code != 0 {
				t.Fatalf("dama retry: exit %d, %s", res.Code, res.Stderr)
			}
			if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 2 {
				t.Fatalf("retried: %s at attempt %d, want DONE at attempt 2", got.Status, got.Attempt)
			}
			events, err := etlcontext.Events(context.Background(), env.Pool, id)
			if err != nil {
				t.Fatal(err)
			}
			var loaded []string
			var progress json.RawMessage
			for _, e := range events {
				switch e.Type {
				case "load_" + lang + ":ROWS_LOADED":
					var p struct {
						File string `json:"file"`
						Rows int    `json:"rows"`
					}
					if err := json.Unmarshal(e.Payload, &p); err != nil {
						t.Fatal(err)
					}
					loaded = append(loaded, fmt.Sprintf("%d:%s:%d", e.Attempt, filepath.Base(p.File), p.Rows))
				case "load_" + lang + ":PROGRESS":
					progress = e.Payload
				}
			}
			want := []string{"1:a.csv:3", "1:b.csv:5", "2:c's file.csv:4", "2:d.csv:2"}
			if fmt.Sprint(loaded) != fmt.Sprint(want) {
				t.Errorf("files loaded (attempt:file:rows) %q, want %q: each once, the retry after the ones done", loaded, want)
			}
			if p, ok := etlcontext.ParseProgress(progress); !ok || p.Fraction != 1 || p.Label != "4/4" {
				t.Errorf("the last progress %s, want 4/4", progress)
			}

			// A file missing: FAILED at once, however many attempts remain.
			args, _ = json.Marshal(map[string]any{"files": []string{files[0], filepath.Join(dir, "missing.csv")}})
			missing := w.submitOf("load_"+lang+"_again", "--args", string(args))
			if got := w.waitFinished(missing, time.Minute); got.Status != etlcontext.StatusFailed || got.Attempt != 1 {
				t.Errorf("a missing file: %s at attempt %d, want FAILED at attempt 1", got.Status, got.Attempt)
			}
			f, err := etlcontext.LastFailure(context.Background(), env.Pool, missing, "load_"+lang+"_again")
			if err != nil || f.Reason != "exit 1: "+filepath.Join(dir, "missing.csv")+" is missing" {
				t.Errorf("a missing file's reason %q (%v), want the task's own", f.Reason, err)
			}
		})
	}
}
