package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// starterDir returns a new directory that any user may reach: as root,
// the starter's commands run as nobody.
func starterDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dama-init-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "etl")
}

// The README's quick start, as a new user types it: dama init, dama
// migrate, dama supervisor, dama submit hello --wait, in the directory
// init wrote, with nothing named but the database.
func TestInitStarterRunsAsItStands(t *testing.T) {
	t.Parallel()
	e := testenv.NewUnmigrated(t)
	dir := starterDir(t)

	res := e.Dama("", "init", dir)
	if res.Code != 0 || !strings.Contains(res.Stdout, "dama submit hello --wait") {
		t.Fatalf("dama init %s: exit %d, stdout %q, stderr %q", dir, res.Code, res.Stdout, res.Stderr)
	}
	config, err := os.ReadFile(filepath.Join(dir, "dama.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, mode := range map[string]os.FileMode{"dama.yaml": 0o644, "hello.sh": 0o755} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != mode {
			t.Errorf("%s: %v, mode %v, want %v", name, err, fi.Mode().Perm(), mode)
		}
	}
	again := e.Dama("", "init", dir)
	if again.Code == 0 || strings.Count(strings.TrimSpace(again.Stderr), "\n") != 0 || !strings.Contains(again.Stderr, "exists") {
		t.Errorf("dama init again: exit %d, stderr %q; want an error in one line", again.Code, again.Stderr)
	}
	if now, _ := os.ReadFile(filepath.Join(dir, "dama.yaml")); !bytes.Equal(now, config) {
		t.Errorf("dama init again changed dama.yaml")
	}

	if res := e.DamaIn(dir, "migrate"); res.Code != 0 {
		t.Fatalf("dama migrate: exit %d: %s", res.Code, res.Stderr)
	}
	sup := e.StartWrapped("", []string{"env", "-C", dir}, "supervisor")
	sup.WaitReady(t, time.Minute)
	res = e.DamaIn(dir, "submit", "hello", "--args", `{"steps": 2}`, "--wait")
	if res.Code != 0 {
		t.Fatalf("dama submit hello --wait: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	id := testenv.Atoi(t, strings.Fields(res.Stdout)[0])
	task := e.Task(id)
	var progress struct{ Step, Of int }
	if task.Status != etlcontext.StatusDone || json.Unmarshal(task.Progress, &progress) != nil || progress.Step != 2 || progress.Of != 2 {
		t.Errorf("task %d: %s, progress %s; want DONE at step 2 of 2", id, task.Status, task.Progress)
	}
	var checkpoint string
	if err := e.Pool.QueryRow(context.Background(), `
		SELECT payload::text FROM data_manager.event_store
		 WHERE etl_context_id = $1 AND type = 'hello:CHECKPOINT' ORDER BY event_id DESC LIMIT 1`, id).Scan(&checkpoint); err != nil || checkpoint != `{"next_step": 3}` {
		t.Errorf("task %d's last checkpoint: %q, %v; want {\"next_step\": 3}", id, checkpoint, err)
	}
	// dama status ID tells it all.
	res = e.DamaIn(dir, "status", strconv.FormatInt(id, 10))
	for _, want := range []string{"\nArguments:   {\"steps\": 2}\n", "\nCheckpoint:  {\"next_step\": 3}\n", "\nProgress:    [####################] 100% 2/2\n",
		" DONE     0     -\n", " hello:FINAL ", "\n  hello: 2 steps done\n"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("dama status %d, want %q in it:\n%s", id, want, res.Stdout)
		}
	}
	// The log names the attempt before the command's first line, and says
	// how it exited after its last.
	log, err := os.ReadFile(filepath.Join(dir, "logs", strconv.FormatInt(id, 10)+".log"))
	if err != nil {
		t.Fatal(err)
	}
	starting := strings.Index(string(log), `msg="command starting" component=taskrunner etl_context_id=`+strconv.FormatInt(id, 10))
	first, last := strings.Index(string(log), "step 1 of 2"), strings.Index(string(log), "hello: 2 steps done")
	exited := strings.Index(string(log), `msg="command exited"`)
	if starting < 0 || first < starting || last < first || exited < last ||
		!strings.Contains(string(log), "attempt=1 host=") || !strings.Contains(string(log[exited:]), " exit_code=0") {
		t.Errorf("task %d's log, want the attempt named first and its exit last:\n%s", id, log)
	}
}

// A configuration the user names must exist, whatever the command; one
// found as ./dama.yaml is read only if no other user could have written
// it. Nothing is submitted from a configuration refused.
func TestConfigFileTheUserDidNotWriteIsRefused(t *testing.T) {
	t.Parallel()
	e := testenv.New(t)
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"status", "--config", "/nonexistent/dama.yaml"}, "--config /nonexistent/dama.yaml: no such file"},
		{[]string{"DAMA_CONFIG=/nonexistent/dama.yaml"}, []string{"status"}, "DAMA_CONFIG=/nonexistent/dama.yaml: no such file"},
	} {
		res := e.DamaWith("", c.env, c.args...)
		if res.Code == 0 || strings.TrimSpace(res.Stderr) != "dama: "+c.want {
			t.Errorf("dama %v (%v): exit %d, stderr %q; want %q", c.args, c.env, res.Code, res.Stderr, c.want)
		}
	}

	dir := starterDir(t)
	if res := e.Dama("", "init", dir); res.Code != 0 {
		t.Fatalf("dama init: %s", res.Stderr)
	}
	config := filepath.Join(dir, "dama.yaml")
	if err := os.Chmod(config, 0o666); err != nil {
		t.Fatal(err)
	}
	if res := e.DamaIn(dir, "submit", "hello"); res.Code == 0 || !strings.Contains(res.Stderr, "may be written by other users (mode 0666): dama.yaml not read") {
		t.Errorf("submit with a ./dama.yaml others may write: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if err := os.Chmod(config, 0o644); err != nil {
		t.Fatal(err)
	}
	// Its directory: whoever may write there may swap it for the next
	// launch's task process.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if res := e.DamaIn(dir, "submit", "hello"); res.Code == 0 || !strings.Contains(res.Stderr, dir+" may be written by other users (mode 0777): dama.yaml not read") {
		t.Errorf("submit with ./dama.yaml in a directory others may write: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// A link: its target is elsewhere.
	if err := os.Rename(config, config+".real"); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(config+".real", config); err != nil {
		t.Fatal(err)
	}
	if res := e.DamaIn(dir, "submit", "hello"); res.Code == 0 || !strings.Contains(res.Stderr, "dama.yaml is not a file: not read") {
		t.Errorf("submit with ./dama.yaml a link: exit %d, stderr %q", res.Code, res.Stderr)
	}
	if err := os.Remove(config); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(config+".real", config); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if res := e.DamaIn(dir, "submit", "hello"); res.Code == 0 || !strings.Contains(res.Stderr, dir+" belongs to another user: dama.yaml not read") {
			t.Errorf("submit with ./dama.yaml in another user's directory: exit %d, stderr %q", res.Code, res.Stderr)
		}
		if err := os.Chown(dir, 0, 0); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(config, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if res := e.DamaIn(dir, "submit", "hello"); res.Code == 0 || !strings.Contains(res.Stderr, "belongs to another user: dama.yaml not read") {
			t.Errorf("submit with another user's ./dama.yaml: exit %d, stderr %q", res.Code, res.Stderr)
		}
		if err := os.Chown(config, 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := e.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d tasks submitted from refused configurations (%v)", n, err)
	}
	if res := e.DamaIn(dir, "submit", "hello"); res.Code != 0 {
		t.Errorf("submit with the user's own ./dama.yaml: exit %d, stderr %q", res.Code, res.Stderr)
	}
}
