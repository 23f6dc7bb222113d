package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
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

	"bytes"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/sql"
)

// Env is one test's world.
type Env struct {
	T testing.TB
	// URL names the test's own database.
	URL string
	// Pool is connected to it.
	Pool *pgxpool.Pool
	// Dir is a temporary directory for configuration, logs and records.
	Dir string
	// DamaBin, SampleETL and SampleEmbedded are the built binaries;
	// TaskRunnerBin is cmd/dama-taskrunner, beside DamaBin, which DamaBin's
	// supervisors run their task processes with; ShimBin is the
	// Kubernetes module's cmd/dama-shim.
	DamaBin, TaskRunnerBin, ShimBin, SampleETL, SampleEmbedded string
	// Server is the private server the database is on (NewOn), or nil for
	// the shared server named by TEST_DATABASE_URL.
	Server *Server
	// LockMode is written into every configuration that names none
	// (WriteConfig): the mode of the LockModes subtest the Env was made
	// in, else DAMA_TEST_LOCK_MODE's; "" leaves dama's default.
	LockMode config.LockMode
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
	create := "CREATE DATABASE " + name
	// A copy of the migrated template on the shared server, when Main made
	// one: a private server has its own, unmigrated.
	template := os.Getenv(templateEnv)
	if migrate && srv == nil && template != "" {
		create += " TEMPLATE " + template
		migrate = false
	}
	// A copy of the template's files rather than a write-ahead-logged copy
	// of its blocks (PostgreSQL 15's default): half the time, and no 7 MB
	// of WAL per test for the server to write and recycle; but it takes two
	// checkpoints, cheap only on a server that does not fsync, as the
	// throwaway ones.
	var fileCopy bool
	if err := adminConn.QueryRow(ctx, `SELECT current_setting('server_version_num')::int >= 150000 AND NOT current_setting('fsync')::bool`).Scan(&fileCopy); err != nil {
		t.Fatalf("read the test server's version: %v", err)
	}
	if fileCopy {
		create += " STRATEGY FILE_COPY"
	}
	began := time.Now()
	if _, err := adminConn.Exec(ctx, create); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	// What a slow test spent before it began: FILE_COPY's checkpoints
	// are shared with every other test's.
	if took := time.Since(began); took > 2*time.Second {
		t.Logf("testenv: creating database %s took %s", name, took.Round(time.Millisecond))
	}
	dbURL, err := withDatabase(admin, name)
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{T: t, URL: dbURL, Dir: t.TempDir(), DamaBin: filepath.Join(binDir, "dama"), TaskRunnerBin: filepath.Join(binDir, "dama-taskrunner"), ShimBin: filepath.Join(binDir, "dama-shim"), SampleETL: filepath.Join(binDir, "sample-etl"), SampleEmbedded: filepath.Join(binDir, "sample-embedded"), Server: srv, LockMode: lockModeOf(t)}
	t.Cleanup(func() {
		e.killProcesses()
		e.checkRaces()
		if t.Failed() {
			e.logTaskLogs()
		}
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
		if err := sql.Migrate(ctx, e.Pool, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
			t.Fatalf("migrate test database: %v", err)
		}
	}
	return e
}

// checkRaces fails the test when a process it started (a supervisor, a
// task process, a keeper, built with the race detector: WithRaceDetector)
// reported a data race in its log: the race detector only prints, and the
// process goes on.
func (e *Env) checkRaces() {
	_ = filepath.WalkDir(e.Dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".log") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err == nil {
			if i := bytes.Index(b, []byte("WARNING: DATA RACE")); i >= 0 {
				e.T.Errorf("%s reports a data race:\n%s", path, b[i:min(len(b), i+4096)])
			}
		}
		return nil
	})
}

// logTaskLogs logs the end of every task process's and keeper's log under
// the test's directory: what a failure's cause is most often written in.
func (e *Env) logTaskLogs() {
	const tail = 8 << 10
	for _, pattern := range []string{"*.log", ".keeper/*.log"} {
		paths, _ := filepath.Glob(filepath.Join(e.Dir, "logs", pattern))
		for _, path := range paths {
			b, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			if len(b) > tail {
				b = b[len(b)-tail:]
			}
			e.T.Logf("%s (its last %d bytes):\n%s", path, len(b), b)
		}
	}
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

// WithRaceDetector runs e's binaries, from here on, as built with the race
// detector, when the tests have it, and watches them for data races
// (checkRaces). The chaos tests do, where every concurrent path of a
// supervisor, a task process and a keeper runs, and those of a writer
// flooded through an outage and of a pod's shim. Elsewhere the binaries run as
// users run them, static, which halves the suite's CPU: a sample of
// cmd/dama's tests took 1.85 CPU-minutes with them, 3.48 with race-built
// ones, whose every start costs 70 ms of CPU more.
func (e *Env) WithRaceDetector() {
	if !raceEnabled {
		return
	}
	dir := filepath.Join(filepath.Dir(e.DamaBin), raceDir)
	e.DamaBin, e.TaskRunnerBin, e.ShimBin = filepath.Join(dir, "dama"), filepath.Join(dir, "dama-taskrunner"), filepath.Join(dir, "dama-shim")
	e.SampleETL, e.SampleEmbedded = filepath.Join(dir, "sample-etl"), filepath.Join(dir, "sample-embedded")
}

// With returns the test's world with dama run from bin, another release's
// binary: the same database, directory and cleanup.
func (e *Env) With(bin string) *Env {
	c := *e
	c.DamaBin = bin
	return &c
}

// LockModeEnv names the environment variable that runs the tests in one
// lock mode: every configuration that names none gets "lock_mode:
// <value>", and LockModes runs that mode alone.
const LockModeEnv = "DAMA_TEST_LOCK_MODE"

// lockModes are the modes LockModes runs, each a subtest of that name.
func lockModes() []config.LockMode {
	return []config.LockMode{config.LockModeRow, config.LockModeAdvisory, config.LockModeHost}
}

// LockModes runs f once per lock mode (row, advisory, host), each in a
// parallel subtest named for it: the matrix, for the tests whose
// behaviour depends on how a task process holds its lock. An Env made in
// such a subtest writes its mode into every configuration. With
// DAMA_TEST_LOCK_MODE set, only that mode runs.
func LockModes(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	t.Parallel()
	for _, mode := range lockModes() {
		if only := os.Getenv(LockModeEnv); only != "" && only != string(mode) {
			continue
		}
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			f(t)
		})
	}
}

// lockModeOf is the mode of the innermost LockModes subtest t is in, else
// DAMA_TEST_LOCK_MODE's.
func lockModeOf(t testing.TB) config.LockMode {
	tt, ok := t.(*testing.T)
	if !ok {
		// A benchmark, or an example's stand-in (ForExample), which
		// has no name.
		return config.LockMode(os.Getenv(LockModeEnv))
	}
	parts := strings.Split(tt.Name(), "/")
	for i := len(parts) - 1; i > 0; i-- {
		if mode := config.LockMode(parts[i]); slices.Contains(lockModes(), mode) {
			return mode
		}
	}
	return config.LockMode(os.Getenv(LockModeEnv))
}

// WriteConfig writes a configuration file into Dir and returns its path.
// {{sample}} in body is replaced by the sample-etl binary's path, and
// {{dir}} by Dir. Run as root, a body that names no user at its top
// level gets "user: root": a supervisor running as root runs no command
// as root unless told (the tests run them as the test does).
func (e *Env) WriteConfig(body string) string {
	e.T.Helper()
	if os.Geteuid() == 0 && !strings.HasPrefix(body, "user:") && !strings.Contains(body, "\nuser:") {
		body = "user: root\n" + body
	}
	return e.WriteConfigAsIs(body)
}

// WriteConfigAsIs is WriteConfig without the user it adds: for a release
// before user: (the previous one, in an upgrade test), which refuses the
// key, or a test of what a root supervisor makes of a kind with none.
func (e *Env) WriteConfigAsIs(body string) string {
	e.T.Helper()
	if e.LockMode != "" && !strings.Contains(body, "lock_mode:") {
		body = "lock_mode: " + string(e.LockMode) + "\n" + body
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

// Eventually polls cond until it returns true or timeout passes, then
// fails the test with msg and cond's last error. It polls after 20ms, then
// twice as long after each poll up to every 160ms: a long wait costs a
// busy machine 8 times fewer polls (each a query, or a read of a log).
// timeout is what the wait needs on an idle machine: on a slower one it is
// stretched, once, by how much slower the machine is now, up to ten times
// in all, and the test's log says so.
func Eventually(t testing.TB, timeout time.Duration, msg string, cond func() (bool, error)) {
	t.Helper()
	eventually(t, 20*time.Millisecond, 160*time.Millisecond, timeout, true, msg, cond)
}

// Within is Eventually for a bound the test asserts (a process gone
// within kill_grace and some, a lock released within its deadline): the
// timeout is not stretched on a slow machine, which does not excuse a
// bound the product promises.
func Within(t testing.TB, timeout time.Duration, msg string, cond func() (bool, error)) {
	t.Helper()
	eventually(t, 20*time.Millisecond, 160*time.Millisecond, timeout, false, msg, cond)
}

// EventuallyEvery is Eventually polling every interval: a benchmark polls
// every millisecond where the poll's period is the resolution of what it
// times, and less often where polling would load the server it measures.
func EventuallyEvery(t testing.TB, every, timeout time.Duration, msg string, cond func() (bool, error)) {
	t.Helper()
	eventually(t, every, every, timeout, true, msg, cond)
}

// eventually polls cond after every, then twice as long after each poll up
// to most; stretch allows the one stretch of a timed-out wait, short of
// the test binary's own deadline.
func eventually(t testing.TB, every, most, timeout time.Duration, stretch bool, msg string, cond func() (bool, error)) {
	t.Helper()
	began := time.Now()
	deadline := began.Add(timeout)
	var (
		lastErr  error
		extended bool
	)
	for {
		ok, err := cond()
		if ok {
			return
		}
		lastErr = err
		if time.Now().After(deadline) {
			pace := pace()
			if ratio := slowness(pace); stretch && !extended && ratio > 1 {
				extended = true
				more := time.Duration(float64(timeout) * (ratio - 1))
				if d, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
					// A clean failure, not go test's panic at its -timeout.
					if end, ok := d.Deadline(); ok {
						more = max(0, min(more, time.Until(end)-time.Minute))
					}
				}
				deadline = deadline.Add(more)
				t.Logf("still waiting for %s after %s: a fork/exec of /bin/true takes %s here now, against %s idle: waiting %s more",
					msg, time.Since(began).Round(time.Millisecond), pace.Round(10*time.Microsecond), idlePace, more.Round(time.Millisecond))
				continue
			}
			t.Fatalf("timed out after %s waiting for %s (last error: %v); %s", time.Since(began).Round(time.Millisecond), msg, lastErr, Pace())
		}
		<-time.After(every)
		every = min(2*every, most)
	}
}

// Drains waits until left counts nothing left, however long that takes
// while the count keeps falling: it fails only once the count has not
// fallen for stall. A test that settles many tasks waits at the machine's
// own pace, and still fails soon when nothing moves. left's error says
// what is left (or why it could not count: n < 0).
func Drains(t testing.TB, stall time.Duration, msg string, left func() (n int, err error)) {
	t.Helper()
	began, fell := time.Now(), time.Now()
	least := -1
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := left()
		switch {
		case n == 0:
			return
		case n > 0 && (least < 0 || n < least):
			least, fell = n, time.Now()
		}
		if time.Since(fell) > stall {
			t.Fatalf("waiting for %s: %d left, none done for %s, %s since the wait began (%v); %s",
				msg, least, stall, time.Since(began).Round(time.Second), err, Pace())
		}
		<-tick.C
	}
}

// Pace is the machine's pace at this moment, for a message that must tell
// a slow machine from a wrong result: how long a fork/exec of /bin/true
// takes, the median of 9 (2–3 ms on this project's idle 2-core VM; 4.5–4.9
// ms on a slower one of its kind, where the suite's deadlines were first
// found too short).
func Pace() string {
	p := pace()
	if p == 0 {
		return "the machine's pace is unknown: /bin/true does not run"
	}
	return fmt.Sprintf("a fork/exec of /bin/true takes %s here now (median of 9; 2–3 ms on an idle 2-core VM)", p.Round(10*time.Microsecond))
}

// idlePace is what pace measures on this project's idle 2-core VM, at the
// top of its range.
const idlePace = 3 * time.Millisecond

// slowness is how many times slower than this project's idle 2-core VM a
// machine is whose fork/exec of /bin/true takes pace, from 1 to 10.
func slowness(pace time.Duration) float64 {
	if pace == 0 {
		return 1
	}
	return min(max(float64(pace)/float64(idlePace), 1), 10)
}

// pace is the median time of 9 fork/execs of /bin/true; 0 if it fails.
func pace() time.Duration {
	var took []time.Duration
	for range 9 {
		start := time.Now()
		if err := exec.Command("/bin/true").Run(); err != nil {
			return 0
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	return took[len(took)/2]
}

// Holds checks cond every 20ms for d, and reports whether it held all
// along: false as soon as it does not. It is how a test watches a window
// in which something must not happen (a second start, a beat, a write).
func Holds(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if !cond() {
			return false
		}
		if !time.Now().Before(deadline) {
			return true
		}
		<-tick.C
	}
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

// Launch starts the next attempt of task id, which has its River job, as
// a supervisor's step does (etlcontext.StartIfFree), and returns its run.
func (e *Env) Launch(id int64) etlcontext.Run {
	e.T.Helper()
	ctx := context.Background()
	c, err := etlcontext.Get(ctx, e.Pool, id)
	if err != nil || c.RiverJobID == nil {
		e.T.Fatalf("read task %d to start it: %v (a job: %t)", id, err, err == nil && c.RiverJobID != nil)
	}
	run, wait, err := etlcontext.StartIfFree(ctx, e.Pool, etlcontext.Start{Read: c, Job: *c.RiverJobID, QueueMax: 1 << 30,
		Attempt: c.Attempt + 1, LaunchedBy: "test"})
	if err != nil || wait != etlcontext.WaitNone {
		e.T.Fatalf("start task %d: %v (waits for %q)", id, err, wait)
	}
	return run
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
