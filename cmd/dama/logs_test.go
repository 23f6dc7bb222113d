package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// logsConfig keeps 64 KiB of each attempt's output in the database, written
// every 200ms. chatty writes 3000 numbered lines of 100 bytes (300 KB) at
// once; slow writes 30 lines over about 3 s.
const logsConfig = `
log_dir: {{dir}}/logs
poll_interval: 300ms
log_tail_bytes: 65536
log_tail_interval: 200ms
kinds:
  chatty:
    command: ["/bin/sh", "-c", "i=1; while [ $i -le 3000 ]; do printf 'chatty line %04d %s\n' $i ________________________________________________________________________________; i=$((i+1)); done"]
  slow:
    command: ["/bin/sh", "-c", "for i in $(seq 1 30); do echo \"slow line $i\"; sleep 0.1; done"]
`

// keptBytes is how much of context id's output the database keeps.
func keptBytes(t *testing.T, env *testenv.Env, id int64) int {
	t.Helper()
	var n int
	if err := env.Pool.QueryRow(context.Background(),
		`SELECT coalesce(sum(octet_length(data)), 0) FROM data_manager.log_chunks WHERE etl_context_id = $1`, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Each attempt's output is also kept in the database as a bounded tail:
// dama logs prints the whole file on the task's host, and the tail (with
// what was not kept said on stderr) once the file is gone with its host,
// or while the task runs, to its end with --follow.
func TestLogsFromAnyHost(t *testing.T) { testenv.LockModes(t, testLogsFromAnyHost) }

func testLogsFromAnyHost(t *testing.T) {
	env := testenv.New(t)
	cfg := env.WriteConfig(logsConfig)
	w := &world{Env: env, cfg: cfg}
	env.Start(cfg, "supervisor")

	chatty := w.submitOf("chatty")
	if got := w.waitSettled(chatty, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the chatty task: %s, want DONE", got.Status)
	}
	id := strconv.FormatInt(chatty, 10)
	here := env.Dama(cfg, "logs", id)
	if here.Code != 0 || !strings.Contains(here.Stdout, "chatty line 0001 ") || !strings.Contains(here.Stdout, "chatty line 3000 ") || here.Stderr != "" {
		t.Errorf("dama logs on the task's host: exit %d, %d bytes, stderr %q; want the whole file", here.Code, len(here.Stdout), here.Stderr)
	}
	// Bounded: 64 KiB, give or take one write's.
	if n := keptBytes(t, env, chatty); n < 64<<10 || n > 2*(64<<10) {
		t.Errorf("the database keeps %d bytes of a 300 KB output, want 64 to 128 KiB", n)
	}
	// The host is gone, and its file with it.
	task := w.task(chatty)
	if err := os.Remove(*task.LogPath); err != nil {
		t.Fatal(err)
	}
	gone := env.Dama(cfg, "logs", id)
	// The tail ends with the attempt's output: its last write comes
	// before the outcome.
	lastLine := "chatty line 3000 " + strings.Repeat("_", 80) + "\n"
	if gone.Code != 0 || strings.Contains(gone.Stdout, "chatty line 0001 ") || !strings.Contains(gone.Stdout, lastLine) {
		t.Errorf("dama logs once the file is gone: exit %d, %d bytes ending %q; want the tail, to the command's last line", gone.Code, len(gone.Stdout), lastBytes([]byte(gone.Stdout), 300))
	}
	if !strings.HasPrefix(gone.Stderr, "dama: open the log of task "+id+": ") || !strings.Contains(gone.Stderr, ": printing the output the database keeps\n") || !strings.Contains(gone.Stderr, "attempt 1: its first ") || !strings.Contains(gone.Stderr, " bytes are not kept") {
		t.Errorf("dama logs once the file is gone: stderr %q; want where the log is and what was not kept", gone.Stderr)
	}

	// Another host's task: its tail, whatever this host has at the path.
	if _, err := env.Pool.Exec(context.Background(), `UPDATE data_manager.etl_contexts SET host_id = 'elsewhere', host = 'elsewhere' WHERE etl_context_id = $1`, chatty); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(*task.LogPath, []byte("not this task's log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	elsewhere := env.Dama(cfg, "logs", id)
	if elsewhere.Code != 0 || elsewhere.Stdout != gone.Stdout || !strings.HasPrefix(elsewhere.Stderr, "dama: the log of task "+id+" is on host elsewhere: ") {
		t.Errorf("dama logs of another host's task: exit %d, stderr %q, the tail %v; want the tail, and where the file is", elsewhere.Code, elsewhere.Stderr, elsewhere.Stdout == gone.Stdout)
	}

	// While it runs, from the database to its end: its file is not where
	// the context says, as on another host.
	slow := w.submitOf("slow")
	w.waitFor(slow, 30*time.Second, "to run its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil })
	if _, err := env.Pool.Exec(context.Background(), `UPDATE data_manager.etl_contexts SET log_path = log_path || '.elsewhere' WHERE etl_context_id = $1`, slow); err != nil {
		t.Fatal(err)
	}
	followed := env.Dama(cfg, "logs", "--follow", strconv.FormatInt(slow, 10))
	if followed.Code != 0 {
		t.Fatalf("dama logs --follow from the database: exit %d, %s", followed.Code, followed.Stderr)
	}
	if got := w.task(slow); !got.Status.Finished() {
		t.Errorf("dama logs --follow returned while the task was %s", got.Status)
	}
	last := 0
	for _, line := range strings.Split(followed.Stdout, "\n") {
		var n int
		if _, err := fmt.Sscanf(line, "slow line %d", &n); err == nil {
			if n != last+1 {
				t.Errorf("followed from the database: line %d after %d", n, last)
			}
			last = n
		}
	}
	if last != 30 || !strings.Contains(followed.Stdout, "command starting") {
		t.Errorf("followed from the database to line %d, want 30 and the task process's own lines:\n%s", last, followed.Stdout)
	}
}

// On a terminal, dama logs shows the escape sequences a command wrote
// rather than let the terminal act on them; --raw prints them as they are.
func TestLogsOnATerminalShowEscapeSequences(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  rogue:
    command: ["/bin/sh", "-c", "printf 'before \\033]0;pwned\\007 after\\n'"]
`)
	w := &world{Env: env, cfg: cfg}
	env.Start(cfg, "supervisor")
	id := strconv.FormatInt(w.submitOf("rogue"), 10)
	w.waitSettled(testenv.Atoi(t, id), time.Minute)
	if out := onTerminal(t, env, cfg, "200 50", 30*time.Second, "logs", id); !strings.Contains(out, "before ^[]0;pwned^G after") || strings.Contains(out, "\x1b]0;") {
		t.Errorf("dama logs on a terminal: %q, want the sequence shown, not sent", out)
	}
	if out := onTerminal(t, env, cfg, "200 50", 30*time.Second, "logs", "--raw", id); !strings.Contains(out, "before \x1b]0;pwned\x07 after") {
		t.Errorf("dama logs --raw on a terminal: %q, want the sequence as it is", out)
	}
}
