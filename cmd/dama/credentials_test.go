package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// A command gets none of dama's credentials (DATABASE_URL, PG* variables)
// unless its kind names them in pass_env; the rest of the supervisor's
// environment, and what dama sets for it, it gets: its libpq sessions
// named by its run, and the server's check for a dead client after its
// own options (unless its kind names its sessions, or says not to).
func TestACommandGetsDamasCredentialsOnlyWhenItsKindAsks(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  plain:
    command: ["/bin/sh", "-c", "env > {{dir}}/env-$DAMA_ETL_CONTEXT_ID"]
  trusted:
    command: ["/bin/sh", "-c", "env > {{dir}}/env-$DAMA_ETL_CONTEXT_ID"]
    pass_env: [DATABASE_URL, PGPASSWORD]
  named:
    command: ["/bin/sh", "-c", "env > {{dir}}/env-$DAMA_ETL_CONTEXT_ID"]
    pass_env: [PGAPPNAME, PGOPTIONS]
  unfenced:
    command: ["/bin/sh", "-c", "env > {{dir}}/env-$DAMA_ETL_CONTEXT_ID"]
    session_fence: false
`)
	w := &world{Env: env, cfg: cfg}
	env.StartWith(cfg, []string{"PGPASSWORD=not-for-commands", "PGAPPNAME=dama-test", "PGOPTIONS=-c work_mem=64MB", "ETL_BUCKET=s3://bucket"}, nil, "supervisor")
	environ := func(kind string) map[string]string {
		t.Helper()
		res := w.Dama(cfg, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		id := testenv.Atoi(t, res.Stdout)
		if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
			t.Fatalf("%s task %s, want DONE", kind, got.Status)
		}
		data, err := os.ReadFile(filepath.Join(env.Dir, fmt.Sprintf("env-%d", id)))
		if err != nil {
			t.Fatal(err)
		}
		vars := map[string]string{}
		for line := range strings.SplitSeq(string(data), "\n") {
			if name, value, ok := strings.Cut(line, "="); ok {
				vars[name] = value
			}
		}
		return vars
	}
	plain := environ("plain")
	for _, name := range []string{"DATABASE_URL", "PGPASSWORD", "DAMA_CONFIG"} {
		if v, ok := plain[name]; ok {
			t.Errorf("a kind without pass_env got %s=%s", name, v)
		}
	}
	for _, name := range []string{"ETL_BUCKET", "DAMA_ETL_CONTEXT_ID", "DAMA_RUN_ID", "PATH"} {
		if _, ok := plain[name]; !ok {
			t.Errorf("a kind without pass_env lacks %s", name)
		}
	}
	trusted := environ("trusted")
	if trusted["DATABASE_URL"] == "" || trusted["PGPASSWORD"] != "not-for-commands" {
		t.Errorf("a kind with pass_env [DATABASE_URL, PGPASSWORD] got DATABASE_URL=%q PGPASSWORD=%q", trusted["DATABASE_URL"], trusted["PGPASSWORD"])
	}
	for name, vars := range map[string]map[string]string{"plain": plain, "trusted": trusted} {
		if got, want := vars["PGAPPNAME"], protocol.SessionName(vars["DAMA_RUN_ID"]); got != want {
			t.Errorf("%s: PGAPPNAME=%q, want %q", name, got, want)
		}
		if got := vars["PGOPTIONS"]; got != protocol.SessionCheckOption {
			t.Errorf("%s: PGOPTIONS=%q, want %q", name, got, protocol.SessionCheckOption)
		}
	}
	named := environ("named")
	if named["PGAPPNAME"] != "dama-test" || named["PGOPTIONS"] != "-c work_mem=64MB "+protocol.SessionCheckOption {
		t.Errorf("a kind passing its own: PGAPPNAME=%q PGOPTIONS=%q", named["PGAPPNAME"], named["PGOPTIONS"])
	}
	unfenced := environ("unfenced")
	for _, name := range []string{"PGAPPNAME", "PGOPTIONS"} {
		if v, ok := unfenced[name]; ok {
			t.Errorf("a kind with session_fence: false got %s=%s", name, v)
		}
	}
}

// The database password shows nowhere: not in any process's arguments, in
// the supervisor's, the page's or a task's log, in events, on the page, or
// in an error about the URL.
func TestThePasswordNeverShows(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t)
	env := testenv.NewOn(t, srv)
	ctx := context.Background()
	password := "pw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if _, err := env.Pool.Exec(ctx, `CREATE ROLE dama_secret LOGIN SUPERUSER PASSWORD '`+password+`'`); err != nil {
		t.Fatal(err)
	}
	srv.RequirePassword(t, "dama_secret")
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword("dama_secret", password)
	withPassword := []string{"DATABASE_URL=" + u.String()}
	wrong := *u
	wrong.User = url.UserPassword("dama_secret", password+"-not")
	// The failing command prints its environment to its log, whose tail
	// its ERROR event keeps.
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  sample: { command: ["{{sample}}"] }
  failing: { command: ["/bin/sh", "-c", "env; echo oops >&2; exit 3"], max_attempts: 1 }
`)
	w := &world{Env: env, cfg: cfg}
	sup := env.StartWith(cfg, withPassword, nil, "supervisor")
	const token = "web-token-0123456789"
	webProc, base := startWeb(t, env, cfg, append([]string{webTokenEnv + "=" + token}, withPassword...), "--public-reads")
	var ids []int64
	for _, kind := range []string{"sample", "failing"} {
		res := env.DamaWith(cfg, withPassword, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit %s: %s", kind, res.Stderr)
		}
		ids = append(ids, testenv.Atoi(t, res.Stdout))
	}
	var outputs []string
	for _, id := range ids {
		w.waitSettled(id, time.Minute)
		for _, args := range [][]string{{"status", strconv.FormatInt(id, 10)}, {"events", strconv.FormatInt(id, 10), "--json"}} {
			res := env.DamaWith(cfg, withPassword, args...)
			outputs = append(outputs, res.Stdout, res.Stderr)
		}
		for _, path := range []string{"/api/tasks", fmt.Sprintf("/api/tasks/%d", id), fmt.Sprintf("/api/tasks/%d/log", id), "/metrics"} {
			resp, err := http.Get(base + path)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			outputs = append(outputs, string(b))
		}
	}
	// Errors about the URL: a wrong password, a malformed URL.
	for _, bad := range []string{wrong.String(), strings.Replace(u.String(), "@", "@:not-a-port", 1)} {
		res := env.DamaWith(cfg, []string{"DATABASE_URL=" + bad}, "status")
		if res.Code == 0 {
			t.Errorf("dama status with a bad URL: exit 0")
		}
		outputs = append(outputs, res.Stdout, res.Stderr)
	}
	var stored string
	if err := env.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(coalesce(payload::text, '') || coalesce(meta::text, ''), ''), '') FROM data_manager.event_store`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	outputs = append(outputs, stored)
	logs, _ := filepath.Glob(filepath.Join(env.Dir, "logs", "*.log"))
	for _, f := range append(logs, sup.Log, webProc.Log) {
		b, _ := os.ReadFile(f)
		outputs = append(outputs, string(b))
	}
	cmdlines, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range cmdlines {
		b, _ := os.ReadFile(f)
		outputs = append(outputs, string(b))
	}
	for _, out := range outputs {
		if i := strings.Index(out, password); i >= 0 {
			t.Errorf("the password shows: …%s…", out[max(0, i-120):min(len(out), i+len(password)+20)])
		}
	}
	t.Logf("looked in %d outputs, logs, event payloads and process arguments", len(outputs))
}

// dama's own processes, which hold its credentials in their environment,
// keep a process of the same OS user from reading it: the supervisor, the
// status page and each task process are non-dumpable. Run as root, the
// test runs them as nobody and finds their /proc entries kept root's (as
// the kernel keeps those of a non-dumpable process); run as anyone else,
// it finds their environment unreadable.
func TestDamasProcessesHideTheirEnvironment(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	goFile := filepath.Join(env.Dir, "go")
	var wrapper []string
	if os.Geteuid() == 0 {
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Skipf("no user nobody to run as: %v", err)
		}
		setpriv, err := exec.LookPath("setpriv")
		if err != nil {
			t.Skipf("no setpriv to run as nobody: %v", err)
		}
		wrapper = []string{setpriv, "--reuid=" + nobody.Uid, "--regid=" + nobody.Gid, "--clear-groups"}
		// nobody reaches the binaries, the configuration and the logs.
		for _, dir := range []string{filepath.Dir(env.DamaBin), filepath.Dir(env.Dir), env.Dir} {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Mkdir(filepath.Join(env.Dir, "logs"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(env.Dir, "logs"), int(testenv.Atoi(t, nobody.Uid)), int(testenv.Atoi(t, nobody.Gid))); err != nil {
			t.Fatal(err)
		}
	}
	body := `
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:` + waiterKind(goFile, 1)
	if wrapper != nil {
		// Its commands run as the supervisor does.
		body = "user: nobody\n" + body
	}
	cfg := env.WriteConfig(body)
	sup := env.StartWith(cfg, nil, wrapper, "supervisor")
	webProc := env.StartWith(cfg, nil, wrapper, "web", "--read-only", "--listen", "127.0.0.1:0")
	waitForLog(t, webProc, "serving the status page")
	w := &world{Env: env, cfg: cfg}
	id := w.submitOf("waiter")
	running := w.waitFor(id, 30*time.Second, "to run its command", func(t etlcontext.Task) bool { return t.CommandPGID != nil })
	for name, pid := range map[string]int{"supervisor": sup.Cmd.Process.Pid, "status page": webProc.Cmd.Process.Pid, "task process": *running.PID} {
		environ := fmt.Sprintf("/proc/%d/environ", pid)
		if wrapper == nil {
			if _, err := os.ReadFile(environ); !errors.Is(err, os.ErrPermission) {
				t.Errorf("the %s's environment read by its own user: %v, want permission denied", name, err)
			}
			continue
		}
		fi, err := os.Stat(environ)
		if err != nil {
			t.Fatal(err)
		}
		if uid := fi.Sys().(*syscall.Stat_t).Uid; uid != 0 {
			t.Errorf("the %s's %s belongs to uid %d, want root's: the process is dumpable", name, environ, uid)
		}
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Errorf("the task: %s, want DONE", got.Status)
	}
}
