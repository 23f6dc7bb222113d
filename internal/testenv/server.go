package testenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pgUser is the system user that owns a private server's files when the
// tests run as root: initdb and postgres refuse to run as root. It is the
// user scripts/lib-postgres.sh uses for the shared cluster.
const pgUser = "postgres"

// pgCtlTimeout bounds every initdb and pg_ctl run; pg_ctl's own -t is shorter
// so that it reports its failure first.
const pgCtlTimeout = 2 * time.Minute

// Server is a PostgreSQL server of one test's own, so that the test can stop,
// restart or partition it without disturbing the tests that share the
// cluster named by TEST_DATABASE_URL. It listens on 127.0.0.1 only, and on a
// Unix socket in its directory.
type Server struct {
	bindir string
	// dir holds the data directory, the socket and the server log; it
	// belongs to runAs when the tests run as root.
	dir   string
	runAs string // "" to run initdb and pg_ctl as ourselves
	port  int

	mu      sync.Mutex
	running bool
	// stopBegan and stopTook time the last Stop, for Start's Outage.
	stopBegan time.Time
	stopTook  time.Duration
}

// Outage is what one stop and start of a server took, measured: pg_ctl's
// stop and start, and Down, from the stop's beginning (when the server
// began ending sessions) to the start's end (when it accepts them again).
// On a busy machine pg_ctl alone took 11–35 s: a test that compares an
// outage with reconnect_grace compares this, and says it when it fails.
type Outage struct {
	Stop, Start, Down time.Duration
}

func (o Outage) String() string {
	return fmt.Sprintf("down %s (pg_ctl stop %s, start %s)", o.Down.Round(time.Millisecond), o.Stop.Round(time.Millisecond), o.Start.Round(time.Millisecond))
}

// NewServer initialises and starts a server for t. The server is stopped
// (-m immediate) and its files removed when t ends, whatever the outcome.
func NewServer(t testing.TB) *Server {
	t.Helper()
	return NewServerWith(t, "")
}

// NewServerWith is NewServer with extra postgresql.conf lines, which win
// over the defaults (e.g. "max_connections = 1200").
func NewServerWith(t testing.TB, settings string) *Server {
	t.Helper()
	bindir, err := pgBindir()
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{bindir: bindir}
	if os.Geteuid() == 0 {
		s.runAs = pgUser
		if err := ensurePGUser(); err != nil {
			t.Fatal(err)
		}
	}
	// Not t.TempDir: its parent is private to us, and the server may run as
	// another user.
	s.dir, err = os.MkdirTemp("", "dama-pgsrv-")
	if err != nil {
		t.Fatalf("create server directory: %v", err)
	}
	t.Cleanup(func() { s.cleanup(t) })
	if err := os.Chmod(s.dir, 0o755); err != nil {
		t.Fatalf("chmod server directory: %v", err)
	}
	if s.runAs != "" {
		uid, gid, err := lookupUser(s.runAs)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(s.dir, uid, gid); err != nil {
			t.Fatalf("chown server directory to %s: %v", s.runAs, err)
		}
	}
	if err := s.initData(); err != nil {
		t.Fatal(err)
	}
	// fsync off: the server is thrown away; max_connections: a test may run
	// several supervisors and tasks, each task holding two connections.
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
max_connections = 200
fsync = off
synchronous_commit = off
full_page_writes = off
%s
`, s.dir, settings)
	if err := s.writeFile(s.confPath(), conf, true); err != nil {
		t.Fatalf("configure server: %v", err)
	}
	s.startOnFreePort(t)
	return s
}

// initData makes the server's data directory: a copy of the one initdb
// made for the test binary's first server (in pgdataEnv's directory, which
// Main makes), as initdb costs 1.4 s of CPU and a copy 0.1 s.
func (s *Server) initData() error {
	dir := os.Getenv(pgdataEnv)
	if dir == "" {
		return s.initdb(s.dataDir())
	}
	src := filepath.Join(dir, "data")
	if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
		if s.runAs != "" {
			uid, gid, err := lookupUser(s.runAs)
			if err != nil {
				return err
			}
			if err := os.Chown(dir, uid, gid); err != nil {
				return fmt.Errorf("chown the servers' template directory to %s: %w", s.runAs, err)
			}
		}
		own := filepath.Join(dir, "data-"+randomHex(4))
		if err := s.initdb(own); err != nil {
			return err
		}
		if err := os.Rename(own, src); err != nil {
			// Another test's server made it first.
			os.RemoveAll(own)
		}
	}
	// As the server's user, who owns both directories: root would follow
	// a link that user planted. -a: the modes with the files; -T: dst is
	// the copy, never a directory to copy into.
	if out, err := s.run("cp", "-a", "-T", src, s.dataDir()); err != nil {
		return fmt.Errorf("copy the servers' template data directory: %v\n%s", err, out)
	}
	return nil
}

func (s *Server) initdb(dataDir string) error {
	if out, err := s.run(filepath.Join(s.bindir, "initdb"), "-D", dataDir, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"); err != nil {
		return fmt.Errorf("initdb: %v\n%s", err, out)
	}
	return nil
}

// URL names a superuser connection to the server's "postgres" database over
// TCP on 127.0.0.1.
func (s *Server) URL() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// SocketURL is URL over the server's Unix socket, which Silence never cuts.
func (s *Server) SocketURL() string {
	return fmt.Sprintf("postgres://postgres@/postgres?host=%s&port=%d&sslmode=disable", s.dir, s.port)
}

// Port is the TCP port the server listens on; it stays the same across
// restarts.
func (s *Server) Port() int { return s.port }

// Log returns the server's log so far.
func (s *Server) Log() string {
	b, err := os.ReadFile(s.logPath())
	if err != nil {
		return fmt.Sprintf("(read server log: %v)", err)
	}
	return string(b)
}

// Stop stops the server with pg_ctl's shutdown mode: "fast" (roll back and
// disconnect every session, then checkpoint) or "immediate" (quit at once, as
// a crash would; the next start recovers).
func (s *Server) Stop(t testing.TB, mode string) {
	t.Helper()
	if mode != "fast" && mode != "immediate" && mode != "smart" {
		t.Fatalf("pg_ctl stop: unknown mode %q", mode)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopBegan = time.Now()
	if err := s.stopLocked(mode); err != nil {
		t.Fatal(err)
	}
	s.stopTook = time.Since(s.stopBegan)
}

// Start starts the stopped server again on the same port, and returns the
// outage since the last Stop began.
func (s *Server) Start(t testing.TB) Outage {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		t.Fatal("start server: already running")
	}
	began := time.Now()
	if _, err := s.startLocked(); err != nil {
		t.Fatal(err)
	}
	o := Outage{Stop: s.stopTook, Start: time.Since(began), Down: time.Since(s.stopBegan)}
	if s.stopBegan.IsZero() {
		o.Down = o.Start
	}
	t.Logf("private PostgreSQL server on port %d back: %s", s.port, o)
	return o
}

// Restart stops the server (-m fast), keeps it down for downFor and starts it
// again: every connection made before is gone, the data survives. The
// outage lasts downFor and what pg_ctl takes besides.
func (s *Server) Restart(t testing.TB, downFor time.Duration) Outage {
	t.Helper()
	s.Stop(t, "fast")
	// The length of the outage is the point of the fault, not a guess at
	// how long something takes.
	time.Sleep(downFor)
	return s.Start(t)
}

func (s *Server) dataDir() string  { return filepath.Join(s.dir, "data") }
func (s *Server) confPath() string { return filepath.Join(s.dataDir(), "postgresql.conf") }
func (s *Server) logPath() string  { return filepath.Join(s.dir, "server.log") }

// startOnFreePort picks a free port and starts the server on it, picking
// again when another process took the port between our probe and the
// server's bind.
func (s *Server) startOnFreePort(t testing.TB) {
	t.Helper()
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		// The last setting in the file wins.
		if err := s.writeFile(s.confPath(), fmt.Sprintf("port = %d\n", port), true); err != nil {
			t.Fatalf("configure server port: %v", err)
		}
		s.port = port
		s.mu.Lock()
		collided, err := s.startLocked()
		s.mu.Unlock()
		if err == nil {
			return
		}
		if !collided {
			t.Fatal(err)
		}
		lastErr = err
	}
	t.Fatalf("no free port for the server after 5 tries: %v", lastErr)
}

// startLocked starts the server; collided reports a failure because the
// port was taken.
func (s *Server) startLocked() (collided bool, err error) {
	before := 0
	if fi, err := os.Stat(s.logPath()); err == nil {
		before = int(fi.Size())
	}
	out, err := s.run(filepath.Join(s.bindir, "pg_ctl"), "-D", s.dataDir(), "-l", s.logPath(), "-w", "-t", "60", "start")
	if err == nil {
		s.running = true
		return false, nil
	}
	newLog := s.Log()
	if before <= len(newLog) {
		newLog = newLog[before:]
	}
	// pg_ctl may have given up while the postmaster still runs.
	_, _ = s.run(filepath.Join(s.bindir, "pg_ctl"), "-D", s.dataDir(), "-m", "immediate", "-w", "stop")
	return strings.Contains(newLog, "Address already in use"),
		fmt.Errorf("start server on port %d: %w\n%s\n%s", s.port, err, out, newLog)
}

func (s *Server) stopLocked(mode string) error {
	if !s.running {
		return errors.New("stop server: not running")
	}
	out, err := s.run(filepath.Join(s.bindir, "pg_ctl"), "-D", s.dataDir(), "-m", mode, "-w", "-t", "60", "stop")
	if err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w\n%s", mode, err, out)
	}
	s.running = false
	return nil
}

// cleanup stops the server and removes its files. Should pg_ctl fail, the
// postmaster is killed: its backends exit when they see it gone.
func (s *Server) cleanup(t testing.TB) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.Failed() {
		t.Logf("log of the private PostgreSQL server:\n%s", tail(s.Log(), 16<<10))
	}
	if s.running {
		if err := s.stopLocked("immediate"); err != nil {
			t.Errorf("cleanup: %v", err)
			s.killPostmaster(t)
		}
	}
	if err := os.RemoveAll(s.dir); err != nil {
		t.Errorf("cleanup: remove server directory: %v", err)
	}
}

func (s *Server) killPostmaster(t testing.TB) {
	b, err := os.ReadFile(filepath.Join(s.dataDir(), "postmaster.pid"))
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		t.Errorf("cleanup: kill postmaster %d: %v", pid, err)
	}
}

// run runs a server program as the server's owner, in the server's
// directory (which that user can enter, unlike perhaps ours).
func (s *Server) run(name string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), pgCtlTimeout)
	defer cancel()
	out, err := s.command(ctx, name, args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	return out, nil
}

// command is name run as the server's user, in its directory.
func (s *Server) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	argv := append([]string{name}, args...)
	if s.runAs != "" {
		argv = append([]string{"runuser", "-u", s.runAs, "--"}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = s.dir
	return cmd
}

// pgBindir finds the newest PostgreSQL server binaries, as
// scripts/lib-postgres.sh does.
func pgBindir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return pgVersion(dirs[i]) > pgVersion(dirs[j]) })
	for _, dir := range dirs {
		if isExecutable(filepath.Join(dir, "initdb")) && isExecutable(filepath.Join(dir, "pg_ctl")) {
			return dir, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries in /usr/lib/postgresql/*/bin: run scripts/test.sh, which installs them")
}

// PGBin is the path of the PostgreSQL program name (pg_dump, psql) of the
// newest server binaries, those the test servers run.
func PGBin(name string) (string, error) {
	dir, err := pgBindir()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	if !isExecutable(path) {
		return "", fmt.Errorf("%s is not an executable", path)
	}
	return path, nil
}

// pgVersion is the major version in /usr/lib/postgresql/<version>/bin.
func pgVersion(bindir string) float64 {
	v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(bindir)), 64)
	if err != nil {
		return -1
	}
	return v
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// ensurePGUser creates the system user pgUser if it is missing, as
// scripts/lib-postgres.sh does. Another test process may be creating it at
// the same moment, so a failed useradd is retried until the user exists.
func ensurePGUser() error {
	var lastErr error
	for range 10 {
		if _, _, err := lookupUser(pgUser); err == nil {
			return nil
		}
		out, err := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", pgUser).CombinedOutput()
		if err == nil {
			return nil
		}
		lastErr = fmt.Errorf("useradd %s: %w: %s", pgUser, err, strings.TrimSpace(string(out)))
		time.Sleep(200 * time.Millisecond)
	}
	return lastErr
}

func lookupUser(name string) (uid, gid int, err error) {
	u, err := user.Lookup(name)
	if err != nil {
		return 0, 0, fmt.Errorf("look up user %s: %w", name, err)
	}
	uid, err = strconv.Atoi(u.Uid)
	if err != nil {
		return 0, 0, fmt.Errorf("uid of %s: %w", name, err)
	}
	gid, err = strconv.Atoi(u.Gid)
	if err != nil {
		return 0, 0, fmt.Errorf("gid of %s: %w", name, err)
	}
	return uid, gid, nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeFile writes text to path, a file of the server's data directory,
// in its place or appended, as the server's user (tee): the directory is
// that user's, and root would follow a link that user planted in it.
func (s *Server) writeFile(path, text string, appendTo bool) error {
	args := []string{path}
	if appendTo {
		args = []string{"-a", path}
	}
	cmd := s.command(context.Background(), "tee", args...)
	cmd.Stdin = strings.NewReader(text)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("write %s: %v: %s", path, err, tail(string(out), 500))
	}
	return nil
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "...\n" + s[len(s)-n:]
}

// RequirePassword makes the server ask role for its password
// (scram-sha-256), over TCP and over the socket; every other role is still
// trusted.
func (s *Server) RequirePassword(t testing.TB, role string) {
	t.Helper()
	path := filepath.Join(s.dataDir(), "pg_hba.conf")
	// As the server's user, as writeFile.
	old, err := s.command(context.Background(), "cat", path).Output()
	if err != nil {
		t.Fatalf("read pg_hba.conf: %v", err)
	}
	// The first line that matches decides.
	lines := fmt.Sprintf("local all %[1]s scram-sha-256\nhost all %[1]s 127.0.0.1/32 scram-sha-256\n", role)
	if err := s.writeFile(path, lines+string(old), false); err != nil {
		t.Fatal(err)
	}
	if out, err := s.run(filepath.Join(s.bindir, "pg_ctl"), "-D", s.dataDir(), "reload"); err != nil {
		t.Fatalf("reload the server: %v\n%s", err, out)
	}
}
