// Package testenv gives dama's tests what they run against: a fresh
// PostgreSQL database per test on the server named by TEST_DATABASE_URL (or
// on a private server a test may restart), the dama and sample-etl binaries
// built once per test process, the guarantee that every process a test
// started, directly or through a supervisor, is killed when the test ends,
// and network faults (connections that go silent) on the loopback interface.
package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/shirou/gopsutil/v3/process"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/schema"
)

// binDirEnv carries the directory of the built binaries from Main to New.
const binDirEnv = "DAMA_TEST_BIN_DIR"

// Main builds the binaries, runs the package's tests and removes the
// binaries. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	// A fuzz worker only tries a fuzz target's inputs, none of which starts
	// a process; building the binaries again in each worker would spend a
	// short -fuzztime before the first input.
	if slices.Contains(os.Args[1:], "-test.fuzzworker") {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "dama-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "testenv:", err)
		return 2
	}
	defer os.RemoveAll(dir)
	for _, pkg := range []string{"cmd/dama", "cmd/sample-etl", "cmd/sample-embedded"} {
		args := []string{"build", "-o", filepath.Join(dir, filepath.Base(pkg))}
		if commit := headCommit(); commit != "" {
			args = append(args, "-ldflags", "-X github.com/dama-etl/dama/version.commit="+commit)
		}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./"+pkg)...)
		cmd.Dir = moduleRoot()
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "testenv: build %s: %v\n%s", pkg, err, out)
			return 2
		}
	}
	os.Setenv(binDirEnv, dir)
	return m.Run()
}

// headCommit is the commit the module's checkout is at, "" when unknown.
func headCommit() string {
	cmd := exec.Command("git", "rev-parse", "HEAD")
	cmd.Dir = moduleRoot()
	out, err := cmd.Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

func moduleRoot() string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		panic(fmt.Sprintf("testenv: go env GOMOD: %v", err))
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

// Env is one test's world.
type Env struct {
	T testing.TB
	// URL names the test's own database.
	URL string
	// Pool is connected to it.
	Pool *pgxpool.Pool
	// Dir is a temporary directory for configuration, logs and records.
	Dir string
	// DamaBin, SampleETL and SampleEmbedded are the built binaries.
	DamaBin, SampleETL, SampleEmbedded string
	// Server is the private server the database is on (NewOn), or nil for
	// the shared server named by TEST_DATABASE_URL.
	Server *Server
}

// New creates a database for t, applies the migrations and registers the
// cleanup: kill every process whose environment names the database, then
// drop it.
func New(t testing.TB) *Env {
	t.Helper()
	return newEnv(t, sharedServerURL(t), nil, true)
}

// NewUnmigrated is New without the migrations.
func NewUnmigrated(t testing.TB) *Env {
	t.Helper()
	return newEnv(t, sharedServerURL(t), nil, false)
}

// NewOn is New on srv, a server of the test's own that it may stop, restart
// or partition. The database is not dropped at the end: the server is thrown
// away, and may well be down by then.
func NewOn(t testing.TB, srv *Server) *Env {
	t.Helper()
	return newEnv(t, srv.URL(), srv, true)
}

// NewUnmigratedOn is NewOn without the migrations.
func NewUnmigratedOn(t testing.TB, srv *Server) *Env {
	t.Helper()
	return newEnv(t, srv.URL(), srv, false)
}

func sharedServerURL(t testing.TB) string {
	t.Helper()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		t.Fatal("TEST_DATABASE_URL is not set: run scripts/test.sh, which starts a PostgreSQL server")
	}
	return admin
}

// newEnv creates a database on the server that admin names.
func newEnv(t testing.TB, admin string, srv *Server, migrate bool) *Env {
	t.Helper()
	// Empty unless TestMain called Main: packages that start no process
	// need no binaries.
	binDir := os.Getenv(binDirEnv)
	ctx := context.Background()
	name := "dama_test_" + randomHex(6)
	adminConn, err := pgx.Connect(ctx, admin)
	if err != nil {
		t.Fatalf("connect to the test server: %v", err)
	}
	defer adminConn.Close(ctx)
	if _, err := adminConn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	dbURL, err := withDatabase(admin, name)
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{T: t, URL: dbURL, Dir: t.TempDir(), DamaBin: filepath.Join(binDir, "dama"), SampleETL: filepath.Join(binDir, "sample-etl"), SampleEmbedded: filepath.Join(binDir, "sample-embedded"), Server: srv}
	t.Cleanup(func() {
		e.killProcesses()
		if e.Pool != nil {
			e.Pool.Close()
		}
		if srv != nil {
			return
		}
		conn, err := pgx.Connect(context.Background(), admin)
		if err != nil {
			t.Errorf("cleanup: connect: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("cleanup: drop database %s: %v", name, err)
		}
	})
	e.Pool, err = pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("connect to test database: %v", err)
	}
	if migrate {
		if err := schema.Migrate(ctx, e.Pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Fatalf("migrate test database: %v", err)
		}
	}
	return e
}

func withDatabase(raw, name string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("parse the test server's URL: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// killProcesses kills every process whose environment carries this test's
// database URL or its tag: supervisors, the runners they spawned in
// sessions of their own, and the runners' commands (by the tag alone).
func (e *Env) killProcesses() {
	marker, tag := "DATABASE_URL="+e.URL, e.Tag()
	for range 3 {
		procs, err := process.Processes()
		if err != nil {
			e.T.Errorf("cleanup: list processes: %v", err)
			return
		}
		killed := 0
		for _, p := range procs {
			if int(p.Pid) == os.Getpid() {
				continue
			}
			env, err := p.Environ()
			if err != nil {
				continue
			}
			for _, kv := range env {
				if kv == marker || kv == tag {
					_ = syscall.Kill(int(p.Pid), syscall.SIGKILL)
					killed++
					break
				}
			}
		}
		if killed == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// With returns the test's world with dama run from bin, another release's
// binary: the same database, directory and cleanup.
func (e *Env) With(bin string) *Env {
	c := *e
	c.DamaBin = bin
	return &c
}

// LockModeEnv names the environment variable that runs a test suite in
// another lock mode: WriteConfig gives every configuration that sets none
// "lock_mode: <value>" (scripts/test.sh runs the end-to-end suite once per
// mode).
const LockModeEnv = "DAMA_TEST_LOCK_MODE"

// WriteConfig writes a configuration file into Dir and returns its path.
// {{sample}} in body is replaced by the sample-etl binary's path, and
// {{dir}} by Dir.
func (e *Env) WriteConfig(body string) string {
	e.T.Helper()
	if mode := os.Getenv(LockModeEnv); mode != "" && !strings.Contains(body, "lock_mode:") {
		body = "lock_mode: " + mode + "\n" + body
	}
	body = strings.ReplaceAll(body, "{{sample}}", e.SampleETL)
	body = strings.ReplaceAll(body, "{{dir}}", e.Dir)
	path := filepath.Join(e.Dir, "dama-"+randomHex(3)+".yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		e.T.Fatal(err)
	}
	return path
}

// tag is an environment entry that every process of the test inherits, even
// one whose DATABASE_URL names the database another way: cleanup finds them
// by it.
// Tag is the variable every process the test starts carries, its commands
// included, by which the test finds them (DATABASE_URL is not given to
// commands).
func (e *Env) Tag() string { return "DAMATEST_ENV=" + e.URL }

// Environ is the environment the test's dama processes run with.
func (e *Env) Environ(configPath string) []string {
	env := []string{}
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if name == "DATABASE_URL" || strings.HasPrefix(name, "DAMA_") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "DATABASE_URL="+e.URL, e.Tag())
	if configPath != "" {
		env = append(env, "DAMA_CONFIG="+configPath)
	}
	return env
}

// Result is what a finished dama command printed and returned.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Dama runs the dama binary to completion with args and the given
// configuration, bounded by a minute.
func (e *Env) Dama(configPath string, args ...string) Result {
	e.T.Helper()
	return e.DamaWith(configPath, nil, args...)
}

// DamaWith is Dama with extraEnv entries (NAME=value) added to the test's
// environment.
func (e *Env) DamaWith(configPath string, extraEnv []string, args ...string) Result {
	e.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, e.DamaBin, args...)
	cmd.Env = append(e.Environ(configPath), extraEnv...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if exitErr, ok := err.(*exec.ExitError); ok {
		code = exitErr.ExitCode()
	} else if err != nil {
		e.T.Fatalf("run dama %v: %v", args, err)
	}
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Code: code}
}

// Proc is a long-running process a test started.
type Proc struct {
	Cmd   *exec.Cmd
	Log   string
	done  chan struct{}
	err   error
	ready chan struct{}
}

// Ready is closed once the process told its service manager it is ready
// (sd_notify READY=1 on NOTIFY_SOCKET, which start sets): a supervisor
// does once it works.
func (p *Proc) Ready() <-chan struct{} { return p.ready }

// WaitReady waits, at most timeout, for the process to be Ready, and fails
// t if it exits or the time passes first.
func (p *Proc) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("%s exited before it was ready: %v", filepath.Base(p.Cmd.Path), p.err)
	case <-time.After(timeout):
		t.Fatalf("%s not ready after %s", filepath.Base(p.Cmd.Path), timeout)
	}
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit error.
func (p *Proc) Wait() error {
	<-p.done
	return p.err
}

// Start starts the dama binary with args in a process group of its own; the
// group is killed when the test ends.
func (e *Env) Start(configPath string, args ...string) *Proc {
	e.T.Helper()
	return e.StartWrapped(configPath, nil, args...)
}

// StartWrapped is Start with the dama binary run by wrapper, whose argv is
// followed by the binary's path and args.
func (e *Env) StartWrapped(configPath string, wrapper []string, args ...string) *Proc {
	e.T.Helper()
	return e.StartWith(configPath, nil, wrapper, args...)
}

// StartWith is StartWrapped with extraEnv entries (NAME=value) overriding
// the test's environment, e.g. another DATABASE_URL for the same database.
func (e *Env) StartWith(configPath string, extraEnv, wrapper []string, args ...string) *Proc {
	e.T.Helper()
	return e.start(e.DamaBin, configPath, extraEnv, wrapper, args)
}

// StartProgram is Start for another program than dama, e.g.
// SampleEmbedded.
func (e *Env) StartProgram(bin, configPath string, args ...string) *Proc {
	e.T.Helper()
	return e.start(bin, configPath, nil, nil, args)
}

// StartProgramWith is StartProgram with extraEnv entries (NAME=value)
// added to the test's environment.
func (e *Env) StartProgramWith(bin, configPath string, extraEnv []string, args ...string) *Proc {
	e.T.Helper()
	return e.start(bin, configPath, extraEnv, nil, args)
}

func (e *Env) start(bin, configPath string, extraEnv, wrapper []string, args []string) *Proc {
	e.T.Helper()
	logPath := filepath.Join(e.Dir, fmt.Sprintf("%s-%s.log", args[0], randomHex(3)))
	logFile, err := os.Create(logPath)
	if err != nil {
		e.T.Fatal(err)
	}
	defer logFile.Close()
	argv := append(append(append([]string{}, wrapper...), bin), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	notifySocket, ready := e.listenNotify()
	cmd.Env = append(append(e.Environ(configPath), "NOTIFY_SOCKET="+notifySocket), extraEnv...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		e.T.Fatalf("start %s %v: %v", filepath.Base(bin), args, err)
	}
	p := &Proc{Cmd: cmd, Log: logPath, done: make(chan struct{}), ready: ready}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	e.T.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		if e.T.Failed() {
			out, _ := os.ReadFile(logPath)
			e.T.Logf("log of %s %v:\n%s", filepath.Base(bin), args, out)
		}
	})
	return p
}

// listenNotify opens a socket a process tells its readiness on, as to
// systemd (sd_notify(3)), and returns its path and a channel closed once
// READY=1 arrives. The socket is closed when the test ends.
func (e *Env) listenNotify() (string, chan struct{}) {
	e.T.Helper()
	// Short: a socket's path is at most 107 bytes, and a test's temporary
	// directory is named after the test.
	dir, err := os.MkdirTemp("", "dama-notify-")
	if err != nil {
		e.T.Fatal(err)
	}
	path := filepath.Join(dir, "s")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		e.T.Fatalf("listen for readiness: %v", err)
	}
	// A process a test runs as another user (setpriv) tells it too.
	for _, p := range []string{dir, path} {
		if err := os.Chmod(p, 0o777); err != nil {
			e.T.Fatal(err)
		}
	}
	ready := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		told := false
		for {
			n, err := conn.Read(buf)
			if err != nil {
				return
			}
			for _, line := range strings.Split(string(buf[:n]), "\n") {
				if line == "READY=1" && !told {
					told = true
					close(ready)
				}
			}
		}
	}()
	e.T.Cleanup(func() {
		conn.Close()
		os.RemoveAll(dir)
	})
	return path, ready
}

// Kill sends sig to the process (not its group).
func (p *Proc) Kill(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := p.Cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v to pid %d: %v", sig, p.Cmd.Process.Pid, err)
	}
}

// Eventually polls cond until it returns true or timeout passes, then fails
// the test with msg and cond's last error.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (last error: %v)", timeout, msg, lastErr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Alive reports whether pid names a live (not zombie) process.
func Alive(pid int) bool {
	p, err := process.NewProcess(int32(pid))
	if err != nil {
		return false
	}
	st, err := p.Status()
	if err != nil {
		return false
	}
	for _, s := range st {
		if s == process.Zombie {
			return false
		}
	}
	return true
}

// Atoi parses a trimmed integer or fails the test.
func Atoi(t testing.TB, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		t.Fatalf("parse %q as an integer: %v", s, err)
	}
	return n
}

// exampleT lets Example functions, which have no *testing.T, use New: a
// failure panics, and cleanups run when Close is called.
type exampleT struct {
	testing.TB
	cleanups []func()
	dir      string
}

func (t *exampleT) Helper()                   {}
func (t *exampleT) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleT) Fatal(args ...any)         { panic(fmt.Sprint(args...)) }
func (t *exampleT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (t *exampleT) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }
func (t *exampleT) Logf(f string, a ...any)   {}
func (t *exampleT) Failed() bool              { return false }
func (t *exampleT) TempDir() string {
	if t.dir == "" {
		dir, err := os.MkdirTemp("", "dama-example-")
		if err != nil {
			panic(err)
		}
		t.dir = dir
		t.cleanups = append(t.cleanups, func() { os.RemoveAll(dir) })
	}
	return t.dir
}

// ForExample is New for Example functions: it returns the environment and a
// function that tears it down.
func ForExample() (*Env, func()) {
	t := &exampleT{}
	env := New(t)
	return env, func() {
		for i := len(t.cleanups) - 1; i >= 0; i-- {
			t.cleanups[i]()
		}
	}
}

// Task reads task id from data_manager.dama_task_queue, failing the test
// when it is not there.
func (e *Env) Task(id int64) etlcontext.Task {
	e.T.Helper()
	tasks, err := etlcontext.Tasks(context.Background(), e.Pool, etlcontext.TaskQuery{ID: id})
	if err != nil || len(tasks) != 1 {
		e.T.Fatalf("read task %d: %v (%d rows)", id, err, len(tasks))
	}
	return tasks[0]
}

// WaitForTask reads task id until cond holds of it, at most timeout, and
// returns it then; what says what is waited for.
func (e *Env) WaitForTask(id int64, timeout time.Duration, what string, cond func(etlcontext.Task) bool) etlcontext.Task {
	e.T.Helper()
	var last etlcontext.Task
	Eventually(e.T, timeout, fmt.Sprintf("task %d %s", id, what), func() (bool, error) {
		// A read that fails (the server restarting, failing over) is
		// waited through like an unmet condition.
		tasks, err := etlcontext.Tasks(context.Background(), e.Pool, etlcontext.TaskQuery{ID: id})
		if err != nil || len(tasks) != 1 {
			return false, fmt.Errorf("read task %d: %v (%d rows)", id, err, len(tasks))
		}
		last = tasks[0]
		job := "none"
		if last.JobState != nil {
			job = *last.JobState
		}
		return cond(last), fmt.Errorf("status %s, job %s, attempt %d", last.Status, job, last.Attempt)
	})
	return last
}

// NewLogin creates a login role of its own for the test, a member of the
// roles memberOf, and returns the URL of the test's database as that role.
// The role is dropped at the end of the test (with the server, for a
// server of the test's own). The server trusts local
// connections: no password is needed.
func (e *Env) NewLogin(memberOf ...string) string {
	e.T.Helper()
	ctx := context.Background()
	name := "dama_login_" + randomHex(6)
	if _, err := e.Pool.Exec(ctx, "CREATE ROLE "+name+" LOGIN"); err != nil {
		e.T.Fatalf("create role %s: %v", name, err)
	}
	e.T.Cleanup(func() {
		if e.Server != nil {
			return // the server, and its roles, are thrown away
		}
		// Its sessions go first: a role that is still connected can be
		// dropped, but what it left in the database could not.
		if _, err := e.Pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1`, name); err != nil {
			e.T.Errorf("cleanup: end sessions of role %s: %v", name, err)
		}
		if _, err := e.Pool.Exec(ctx, "DROP OWNED BY "+name+"; DROP ROLE "+name); err != nil {
			e.T.Errorf("cleanup: drop role %s: %v", name, err)
		}
	})
	for _, role := range memberOf {
		if _, err := e.Pool.Exec(ctx, "GRANT "+pgx.Identifier{role}.Sanitize()+" TO "+name); err != nil {
			e.T.Fatalf("grant %s to %s: %v", role, name, err)
		}
	}
	u, err := url.Parse(e.URL)
	if err != nil {
		e.T.Fatal(err)
	}
	u.User = url.User(name)
	return u.String()
}
