package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// A root supervisor never appends a command's output to a file the
// command chose. Reproduced before the guard: with log_dir its kind's
// user's (as `chown -R etl /srv/etl` leaves it), a command linked the next
// task's N.log to a root-only file and its line landed there; with the
// directory above log_dir its user's, it swapped log_dir itself (mv logs
// logs.old; mkdir logs; ln -s /target logs/N.log).
//
// Now such a log_dir is refused at the start, in one line. In a log_dir
// only root controls, a link or another name put at a task's log (as if
// someone could) is never written: the task does not start, its status
// says why, and it runs once the log is a plain file again.
func TestALogDirACommandControlsIsRefused(t *testing.T) {
	t.Parallel()
	u := ensureUser(t, commandUser)
	uid := int(testenv.Atoi(t, u.Uid))
	env := testenv.New(t)
	srv := filepath.Join(env.Dir, "srv")
	logs := filepath.Join(srv, "logs")
	for _, dir := range []string{srv, logs} {
		if err := os.Mkdir(dir, 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(dir, uid, -1); err != nil {
			t.Fatal(err)
		}
	}
	// What the attacker wants root to write to.
	target := filepath.Join(env.Dir, "shadow")
	const shadow = "root:*:20000:0:99999:7:::\n"
	if err := os.WriteFile(target, []byte(shadow), 0o600); err != nil {
		t.Fatal(err)
	}
	// The command links the next tasks' logs to the target, then writes
	// the line that would make a root account of it.
	cfg := env.WriteConfig(`
log_dir: {{dir}}/srv/logs
poll_interval: 200ms
kinds:
  climb:
    user: ` + commandUser + `
    command:
      - /bin/sh
      - -c
      - |
        for n in 1 2 3 4 5 6 7 8; do ln -sf ` + target + ` ` + logs + `/$n.log 2>/dev/null; done
        echo 'rtpwn::0:0::/root:/bin/sh'
`)
	refused := func(what, want string) {
		t.Helper()
		res := env.Dama(cfg, "supervisor")
		lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
		if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], want) {
			t.Errorf("a supervisor with %s: exit %d, stderr %q; want it refused in one line saying %q", what, res.Code, res.Stderr, want)
		}
	}
	refused("log_dir and the directory above it its command's user's", fmt.Sprintf("%s, above it, belongs to uid %d", srv, uid))
	if err := os.Chown(srv, 0, 0); err != nil {
		t.Fatal(err)
	}
	refused("log_dir its command's user's", fmt.Sprintf("log_dir %s belongs to uid %d", logs, uid))
	if err := os.Chown(logs, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(srv, uid, -1); err != nil {
		t.Fatal(err)
	}
	refused("the directory above log_dir its command's user's", fmt.Sprintf("%s, above it, belongs to uid %d", srv, uid))
	if err := os.Chown(srv, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(srv, 0o777); err != nil {
		t.Fatal(err)
	}
	refused("a directory above log_dir anyone may write to", "is not sticky")
	// Sticky, as /tmp: others cannot rename what is root's.
	if err := os.Chmod(srv, os.ModeSticky|0o777); err != nil {
		t.Fatal(err)
	}
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")

	// Root's own mistakes, as if the command could: a link at task 1's
	// log, then log_dir swapped for one with a link at task 2's.
	if err := os.Symlink(target, filepath.Join(logs, "1.log")); err != nil {
		t.Fatal(err)
	}
	first := w.submitOf("climb")
	if first != 1 {
		t.Fatalf("the first task is %d, want 1, whose log is a link", first)
	}
	saysLink := func(id int64) {
		t.Helper()
		testenv.Eventually(t, 30*time.Second, fmt.Sprintf("task %d's status to say its log is a link", id), func() (bool, error) {
			got := w.Dama(cfg, "status", fmt.Sprint(id)).Stdout
			return strings.Contains(got, "is a symbolic link: dama writes no log through a link"), fmt.Errorf("status:\n%s", got)
		})
		if got := w.task(id); got.Status.Finished() || got.Attempt > 1 {
			t.Errorf("task %d: %s, attempt %d; want it waiting, no attempt spent", id, got.Status, got.Attempt)
		}
	}
	saysLink(first)
	if err := os.Rename(logs, logs+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(logs, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(logs, "2.log")); err != nil {
		t.Fatal(err)
	}
	second := w.submitOf("climb")
	if second != 2 {
		t.Fatalf("the second task is %d, want 2, whose log is a link", second)
	}
	saysLink(second)
	if b, _ := os.ReadFile(target); string(b) != shadow {
		t.Fatalf("the root-only file a log was linked to: %q, want it as it was", b)
	}
	// Repaired: the tasks run, once each (task 1's link went with the
	// old directory); the command's own links (it cannot write in
	// log_dir) change nothing.
	if err := os.Remove(filepath.Join(logs, "2.log")); err != nil {
		t.Fatal(err)
	}
	for _, id := range []int64{first, second} {
		if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
			t.Errorf("task %d after the repair: %s after %d attempts, want DONE after 1", id, got.Status, got.Attempt)
		}
	}
	if b, _ := os.ReadFile(target); string(b) != shadow {
		t.Errorf("the root-only file a log was linked to: %q, want it as it was", b)
	}
	if b, err := os.ReadFile(filepath.Join(logs, "2.log")); err != nil || !strings.Contains(string(b), "rtpwn") {
		t.Errorf("task 2's log: %q, %v; want the command's line in it", b, err)
	}
}
