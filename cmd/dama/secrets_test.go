package main

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// spy reads the environment and command line of every new process of the
// host, and what it can open of its descriptors 3 and 4, as fast as it
// can, as a command of dama's own user would to steal its credentials: the newest pids first (the kernel's last pid and the
// few after it, which is how such a reader wins the race with a program's
// first milliseconds), and every process now and then.
type spy struct {
	markers []string
	// exclude is the command line of the processes not read: the
	// supervisor's, which was started with the secrets.
	exclude []byte

	mu sync.Mutex
	// found holds each process in which a marker was read, and where.
	found []string
	// seen counts the environments read of each role of dama's task
	// processes (DAMA_TASK_PROCESS), and of commands (DAMA_RUN_ID).
	seen map[string]map[int]bool
}

func (s *spy) run(ctx context.Context, exclude map[int]bool) {
	read := func(pid int) {
		// A thread's id names its process's entry too.
		proc := cmp.Or(tgid(pid), pid)
		if exclude[proc] {
			return
		}
		// Between its fork and its exec a process started by the
		// supervisor is the supervisor's copy, as non-dumpable as it
		// (the spy, as root, reads it all the same): what it shows after
		// its exec is what it was started with.
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || bytes.Equal(cmdline, s.exclude) {
			return
		}
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil {
			return
		}
		// And the descriptor a task process is handed its secrets on,
		// opened through /proc as a pipe could be (not those of other
		// pipes, whose bytes the spy would take from dama).
		files := map[string][]byte{"environ": data, "cmdline": cmdline}
		fds := []int{4} // a runner's (protocol.SecretsFD)
		if bytes.Contains(cmdline, []byte("\x00keeper\x00")) {
			fds = []int{3} // protocol.KeeperSecretsFD; a runner's 3 is its ready pipe
		}
		for _, fd := range fds {
			// Raw, not an os.File, whose read would wait for data.
			f, err := unix.Open(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
			if err != nil {
				continue
			}
			b := make([]byte, 64<<10)
			n, _ := unix.Read(f, b)
			unix.Close(f)
			files[fmt.Sprintf("fd %d", fd)] = b[:max(n, 0)]
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, m := range s.markers {
			for file, b := range files {
				if bytes.Contains(b, []byte(m)) {
					s.found = append(s.found, fmt.Sprintf("pid %d (%q)'s %s: %q", pid, cmdline, file, b))
				}
			}
		}
		for _, kv := range bytes.Split(data, []byte{0}) {
			name, value, _ := bytes.Cut(kv, []byte("="))
			role := ""
			switch string(name) {
			case "DAMA_TASK_PROCESS":
				role = string(value)
			case "DAMA_RUN_ID":
				role = "command"
			default:
				continue
			}
			if s.seen[role] == nil {
				s.seen[role] = map[int]bool{}
			}
			s.seen[role][proc] = true
		}
	}
	for round := 0; ctx.Err() == nil; round++ {
		if data, err := os.ReadFile("/proc/sys/kernel/ns_last_pid"); err == nil {
			if last, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
				for pid := last - 2; pid <= last+6; pid++ {
					read(pid)
				}
			}
		}
		if round%200 == 0 {
			entries, _ := os.ReadDir("/proc")
			for _, e := range entries {
				if pid, err := strconv.Atoi(e.Name()); err == nil {
					read(pid)
				}
			}
		}
	}
}

// tgid returns the process of thread id tid; 0 when it is gone.
func tgid(tid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", tid))
	if err != nil {
		return 0
	}
	_, rest, _ := strings.Cut(string(data), "\nTgid:")
	line, _, _ := strings.Cut(rest, "\n")
	id, _ := strconv.Atoi(strings.TrimSpace(line))
	return id
}

// No task process holds a secret in its environment or its arguments:
// the database URLs (the supervisor's and the tasks'), libpq's password,
// the status page's tokens. A process of the same user that reads every
// new process's /proc/<pid>/environ and cmdline as fast as it can while
// 30 tasks of every lock mode start (runners, a lock keeper,
// commands), and opens their descriptors through /proc/<pid>/fd, reads
// none of them, though it reads the environments of those processes: they
// come on a socket, which /proc does not open, read once the process is
// non-dumpable. (Run as root, the reader reads even a non-dumpable
// process's environment: what it shows is all a process was started
// with.)
func TestNoSecretInAnyTaskProcesssEnvironment(t *testing.T) {
	env := testenv.New(t)
	marker := "m" + strconv.FormatInt(time.Now().UnixNano(), 36)
	supURL, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts its local connections: a password is sent
	// only if asked for, and here it is a marker.
	taskURL := *supURL
	supURL.User = url.UserPassword(supURL.User.Username(), "sup-"+marker)
	taskURL.User = url.UserPassword(supURL.User.Username(), "task-"+marker)
	secrets := []string{
		"DATABASE_URL=" + supURL.String(),
		taskDatabaseURLEnv + "=" + taskURL.String(),
		"PGPASSWORD=pgpw-" + marker,
		webTokenEnv + "=tok-" + marker,
		webReadTokenEnv + "=read-" + marker,
	}
	var kinds strings.Builder
	for _, mode := range []string{"row", "advisory", "host"} {
		fmt.Fprintf(&kinds, "  %s: { command: [\"/bin/sh\", \"-c\", \"echo '{\\\"type\\\": \\\"progress\\\", \\\"payload\\\": {}}' >&3\"], lock_mode: %s, max_attempts: 1 }\n", mode, mode)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
queues:
  default: { max_running: 30 }
kinds:
` + kinds.String())
	w := &world{Env: env, cfg: cfg}

	s := &spy{markers: []string{marker}, exclude: []byte(env.DamaBin + "\x00supervisor\x00"), seen: map[string]map[int]bool{}}
	ctx, stop := context.WithCancel(context.Background())
	spied := make(chan struct{})
	sup := env.StartWith(cfg, secrets, nil, "supervisor")
	go func() {
		defer close(spied)
		// The supervisor holds them by design: it was started with them.
		s.run(ctx, map[int]bool{os.Getpid(): true, sup.Cmd.Process.Pid: true})
	}()
	defer func() {
		stop()
		<-spied
	}()
	sup.WaitReady(t, 30*time.Second)
	var ids []int64
	for i := range 30 {
		ids = append(ids, w.submitOf([]string{"row", "advisory", "host"}[i%3]))
	}
	for _, id := range ids {
		if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
			t.Errorf("task %d: %s, want DONE", id, got.Status)
		}
	}
	stop()
	<-spied
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range s.found {
		t.Errorf("a secret, in %s", f)
	}
	t.Logf("environments read: %d runners, %d keepers, %d commands", len(s.seen["runner"]), len(s.seen["keeper"]), len(s.seen["command"]))
	// The spy is fast enough to have read them, had they held a secret.
	if len(s.seen["runner"]) < 10 || len(s.seen["command"]) < 1 {
		t.Errorf("the spy read the environments of %d task processes and %d commands of 30: too slow to prove anything (a busy machine may slow it, not this much)", len(s.seen["runner"]), len(s.seen["command"]))
	}
	if _, err := os.Stat(filepath.Join(env.Dir, "logs", ".keeper")); err != nil {
		t.Errorf("no lock keeper started: %v", err)
	}
}

// A task's log is closed to other users: log_dir is made 0750 (an open
// one, as earlier releases made it, is closed), each log 0640, and with
// log_group the directory is that group's, set-group-ID, so that its
// members (operators) read every log and nobody else reads any.
func TestLogsAreClosedToOtherUsers(t *testing.T) {
	t.Parallel()
	group, err := user.LookupGroup("adm")
	if err != nil {
		t.Skipf("no group adm to give the logs to: %v", err)
	}
	gid := testenv.Atoi(t, group.Gid)
	env := testenv.New(t)
	logDir := filepath.Join(env.Dir, "logs")
	if err := os.Mkdir(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
log_group: adm
poll_interval: 300ms
kinds:
  hello: { command: ["/bin/echo", "a line for the group"], max_attempts: 1 }
`)
	w := &world{Env: env, cfg: cfg}
	w.Start(cfg, "supervisor")
	id := w.submitOf("hello")
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task: %s, want DONE", got.Status)
	}
	for path, want := range map[string]os.FileMode{
		logDir:                       os.ModeDir | os.ModeSetgid | 0o750,
		protocol.LogPath(logDir, id): 0o640,
	} {
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode() != want {
			t.Errorf("%s: mode %s, want %s", path, info.Mode(), want)
		}
		if got := info.Sys().(*syscall.Stat_t).Gid; int64(got) != gid {
			t.Errorf("%s: group %d, want adm's (%d)", path, got, gid)
		}
	}
	if os.Geteuid() != 0 {
		return
	}
	// As another user, the log is out of reach; as a member of the
	// group, it reads.
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	// Only log_dir keeps it from them.
	for _, dir := range []string{filepath.Dir(env.Dir), env.Dir} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	read := func(groups string) error {
		args := []string{"--reuid=" + nobody.Uid, "--regid=" + nobody.Gid}
		if groups == "" {
			args = append(args, "--clear-groups")
		} else {
			args = append(args, "--groups="+groups)
		}
		out, err := exec.Command("setpriv", append(args, "cat", protocol.LogPath(logDir, id))...).CombinedOutput()
		if err == nil && !strings.Contains(string(out), "a line for the group") {
			return fmt.Errorf("read %q", out)
		}
		return err
	}
	if err := read(""); err == nil {
		t.Error("another user read the task's log")
	}
	if err := read(group.Gid); err != nil {
		t.Errorf("a member of adm could not read the task's log: %v", err)
	}
}
