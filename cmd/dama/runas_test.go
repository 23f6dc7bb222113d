package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/protocol"
)

// commandUser is the user the tests run commands as, made by them.
const commandUser = "dama-test-cmd"

// ensureUser returns the system user name, made (with a group of its own,
// no home and no shell) when this host lacks it; the test is skipped when
// not root.
func ensureUser(t *testing.T, name string) *user.User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making users and switching to them needs root")
	}
	if u, err := user.Lookup(name); err == nil {
		return u
	}
	if _, err := exec.LookPath("useradd"); err != nil {
		t.Skipf("no useradd to make user %s: %v", name, err)
	}
	out, err := exec.Command("useradd", "--system", "--user-group", "--no-create-home",
		"--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name).CombinedOutput()
	if u, lerr := user.Lookup(name); lerr == nil {
		return u // made meanwhile by another test process
	}
	if err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// probe is what a command running as another user finds it can do, one
// "probe NAME=VALUE" line each in its log.
const probe = `
    command:
      - /bin/sh
      - -c
      - |
        other=$(printf %s "$DAMA_ARGS" | sed -n 's/.*"other": *\([0-9]*\).*/\1/p')
        sup=$(printf %s "$DAMA_ARGS" | sed -n 's/.*"sup": *\([0-9]*\).*/\1/p')
        yes() { if "$@" >/dev/null 2>&1; then echo yes; else echo no; fi; }
        echo "probe uid=$(id -u)"
        echo "probe gid=$(id -g)"
        echo "probe groups=$(id -G | tr ' ' ,)"
        for c in CapEff CapPrm CapAmb CapInh; do echo "probe $(grep "^$c:" /proc/self/status | tr -d ' \t' | tr : =)"; done
        echo "probe home=$HOME"
        echo "probe user=$USER"
        echo "probe logname=$LOGNAME"
        echo "probe list_logs=$(yes ls {{dir}}/logs)"
        echo "probe read_other_log=$(yes cat {{dir}}/logs/$other.log)"
        echo "probe see_keeper=$(yes ls -a {{dir}}/logs/.keeper)"
        echo "probe runner_environ=$(yes cat /proc/$PPID/environ)"
        echo "probe signal_runner=$(yes kill -0 $PPID)"
        echo "probe signal_supervisor=$(yes kill -0 $sup)"
        echo '{"type": "progress", "payload": {"step": 1, "of": 1}}' >&3
`

// runProbe runs a plain task, then the probe as commandUser beside it,
// under a supervisor started with wrapper, and returns what the probe
// found.
func runProbe(t *testing.T, env *testenv.Env, cfg string, wrapper []string) map[string]string {
	t.Helper()
	w := &world{Env: env, cfg: cfg}
	sup := env.StartWith(cfg, nil, wrapper, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	other := w.submitOf("plain")
	if got := w.waitSettled(other, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the plain task: %s, want DONE", got.Status)
	}
	id := w.submitOf("probe", "--args", `{"sup": `+strconv.Itoa(sup.Cmd.Process.Pid)+`, "other": `+strconv.FormatInt(other, 10)+`}`)
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Progress == nil {
		t.Fatalf("the probe: %s, progress %s; want DONE with its progress stored", got.Status, got.Progress)
	}
	data, err := os.ReadFile(protocol.LogPath(filepath.Join(env.Dir, "logs"), id))
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	for line := range strings.SplitSeq(string(data), "\n") {
		if kv, ok := strings.CutPrefix(line, "probe "); ok {
			name, value, _ := strings.Cut(kv, "=")
			found[name] = value
		}
	}
	return found
}

// checkProbe fails t for what the probe of commandUser u could do that
// it must not, or was not given.
func checkProbe(t *testing.T, u *user.User, found map[string]string) {
	t.Helper()
	groups, err := u.GroupIds()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"uid": u.Uid, "gid": u.Gid, "groups": strings.Join(groups, ","),
		"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapAmb": "0000000000000000", "CapInh": "0000000000000000",
		"home": u.HomeDir, "user": u.Username, "logname": u.Username,
		"list_logs": "no", "read_other_log": "no", "see_keeper": "no",
		"runner_environ": "no", "signal_runner": "no", "signal_supervisor": "no",
	}
	for name, v := range want {
		if found[name] != v {
			t.Errorf("the command as %s: %s=%q, want %q", u.Username, name, found[name], v)
		}
	}
}

// A kind's command runs as its user: that uid, gid and only that user's
// groups, that user's HOME, USER and LOGNAME, and no capability, under a
// supervisor running as root. It cannot list the log directory, read
// another task's log, see the lock keeper's socket, read its runner's
// environment, or signal its runner or the supervisor; its events, its
// log and its lock work as for any command.
func TestACommandRunsAsItsKindsUser(t *testing.T) {
	t.Parallel()
	u := ensureUser(t, commandUser)
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  plain:
    command: ["/bin/sh", "-c", "echo a line for dama alone"]
  probe:
    user: ` + commandUser + `
    lock_mode: host` + probe)
	checkProbe(t, u, runProbe(t, env, cfg, nil))
}

// The same under a supervisor that runs as a user of its own, granted
// CAP_SETUID, CAP_SETGID and CAP_KILL as ambient capabilities (a
// service's AmbientCapabilities): a plain uid switch would pass them on
// to the command; it gets none.
func TestACommandGetsNoCapabilityOfItsSupervisors(t *testing.T) {
	t.Parallel()
	u := ensureUser(t, commandUser)
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skipf("no user nobody to run the supervisor as: %v", err)
	}
	env := testenv.New(t)
	// nobody reaches the binaries and the configuration, and owns the
	// logs.
	for _, dir := range []string{filepath.Dir(env.DamaBin), filepath.Dir(env.Dir), env.Dir} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	logs := filepath.Join(env.Dir, "logs")
	if err := os.Mkdir(logs, 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(logs, int(testenv.Atoi(t, nobody.Uid)), int(testenv.Atoi(t, nobody.Gid))); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
user: nobody
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  plain:
    command: ["/bin/sh", "-c", "echo a line for dama alone"]
  probe:
    user: ` + commandUser + `
    lock_mode: host` + probe)
	caps := "+setuid,+setgid,+kill"
	wrapper := []string{"setpriv", "--reuid=" + nobody.Uid, "--regid=" + nobody.Gid, "--clear-groups",
		"--inh-caps=" + caps, "--ambient-caps=" + caps}
	checkProbe(t, u, runProbe(t, env, cfg, wrapper))

	// Without the capabilities, the same supervisor refuses the kind at
	// its start, in one line naming it and its user.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	plain := exec.CommandContext(ctx, "setpriv", "--reuid="+nobody.Uid, "--regid="+nobody.Gid, "--clear-groups", env.DamaBin, "supervisor")
	plain.Env = env.Environ(cfg)
	out, err := plain.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], "kind probe: this process cannot switch to user "+commandUser) {
		t.Errorf("a supervisor that cannot switch users: %v, %q; want it refused in one line naming the kind and the user", err, out)
	}
}

// A supervisor running as root refuses a kind that names no user, in one
// line: a command never runs as root by accident.
func TestARootSupervisorRefusesAKindWithoutAUser(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("not root")
	}
	env := testenv.New(t)
	cfg := env.WriteConfigAsIs(`
log_dir: {{dir}}/logs
kinds:
  nameless: { command: ["/bin/true"] }
`)
	res := env.Dama(cfg, "supervisor")
	lines := strings.Split(strings.TrimSpace(res.Stderr), "\n")
	if res.Code == 0 || len(lines) != 1 || !strings.Contains(lines[0], "kind nameless: this supervisor runs as root") {
		t.Errorf("a root supervisor with a kind without user: exit %d, stderr %q; want one line refusing it", res.Code, res.Stderr)
	}
}

// A command holds its stdio and its events pipe, and nothing its
// supervisor inherited: a descriptor the supervisor was started with,
// left open across exec (as a harness's pipe was, as fd 251), reaches
// neither the task process nor its command.
func TestACommandGetsNoDescriptorItsSupervisorInherited(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	marker := filepath.Join(env.Dir, "inherited-descriptor")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  fds: { command: ["/bin/sh", "-c", "ls -l /proc/self/fd/ /proc/$PPID/fd/"] }
`)
	// The shell opens fd 7 without close-on-exec and execs the supervisor.
	w := &world{Env: env, cfg: cfg}
	sup := env.StartWith(cfg, nil, []string{"/bin/sh", "-c", `exec 7<"$0"; exec "$@"`, marker}, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	if out, err := exec.Command("ls", "-l", fmt.Sprintf("/proc/%d/fd/", sup.Cmd.Process.Pid)).CombinedOutput(); err != nil || !strings.Contains(string(out), marker) {
		t.Fatalf("the supervisor does not hold the inherited descriptor (%v):\n%s", err, out)
	}
	id := w.submitOf("fds")
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone {
		t.Fatalf("the task: %s, want DONE", got.Status)
	}
	b, err := os.ReadFile(protocol.LogPath(filepath.Join(env.Dir, "logs"), id))
	if err != nil {
		t.Fatal(err)
	}
	// Both listings, the command's and its task process's (the command
	// runs as root, which may read a non-dumpable process's).
	if strings.Count(string(b), "/fd/:") != 2 || strings.Contains(string(b), marker) {
		t.Errorf("the command's and its task process's descriptors name what the supervisor inherited, or are not both listed:\n%s", b)
	}
}

// Kinds whose commands run as one user can forge each other's reports
// where the kernel lets a process trace another of its user (no Yama, or
// its ptrace_scope 0): a command of one took another's events descriptor
// with pidfd_getfd and recorded a CHECKPOINT, a child and a final ERROR
// for it. A supervisor says so once, at its start, naming them; root's
// kinds aside.
func TestKindsSharingAUserAreWarnedOf(t *testing.T) {
	t.Parallel()
	if scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(scope)) != "0" {
		t.Skipf("Yama's ptrace_scope is %s here: a process traces only its descendants, nothing to warn of", strings.TrimSpace(string(scope)))
	}
	ensureUser(t, commandUser)
	env := testenv.New(t)
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
kinds:
  extract: { user: ` + commandUser + `, command: ["/bin/true"] }
  load: { user: ` + commandUser + `, command: ["/bin/true"] }
  rooted: { command: ["/bin/true"] }
  alone: { command: ["/bin/true"] }
`)
	sup := env.Start(cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	var log string
	testenv.Eventually(t, 30*time.Second, "the supervisor to warn of kinds sharing a user", func() (bool, error) {
		b, err := os.ReadFile(sup.Log)
		log = string(b)
		return strings.Contains(log, "kinds share a user"), err
	})
	u, err := user.Lookup(commandUser)
	if err != nil {
		t.Fatal(err)
	}
	if want := `shared="uid ` + u.Uid + `: extract, load"`; strings.Count(log, "kinds share a user") != 1 || !strings.Contains(log, want) {
		t.Errorf("the supervisor's log, want one WARNING with %s:\n%s", want, log)
	}
}

// A command its kind's user may not run (in a directory only root may
// search) is found at the supervisor's start and at each launch, as a
// missing one is: its task waits QUEUED, no attempt spent, and the reason
// names the user and the fix; once the directory is opened it runs, as
// its first attempt. One that an ACL lets the user reach, past mode bits
// that would not, is not refused.
func TestACommandItsUserCannotRunWaitsAndSaysWhy(t *testing.T) {
	t.Parallel()
	u := ensureUser(t, commandUser)
	env := testenv.New(t)
	for _, dir := range []string{filepath.Dir(env.Dir), env.Dir} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	script := func(dir string) string {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "hello.sh")
		if err := os.WriteFile(path, []byte("#!/bin/sh\necho hello from $(id -un)\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	private, granted := filepath.Join(env.Dir, "private"), filepath.Join(env.Dir, "granted")
	hello, aclHello := script(private), script(granted)
	// user::rwx, user:<uid>:--x, group::---, mask::--x, other::---
	acl := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range [][3]uint32{{0x01, 7, ^uint32(0)}, {0x02, 1, uint32(testenv.Atoi(t, u.Uid))}, {0x04, 0, ^uint32(0)}, {0x10, 1, ^uint32(0)}, {0x20, 0, ^uint32(0)}} {
		acl = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint16(binary.LittleEndian.AppendUint16(acl, uint16(e[0])), uint16(e[1])), e[2])
	}
	if err := unix.Setxattr(granted, "system.posix_acl_access", acl, 0); err != nil {
		t.Skipf("no ACL on this file system: %v", err)
	}
	cfg := env.WriteConfig(`
log_dir: {{dir}}/logs
poll_interval: 300ms
kinds:
  hello: { user: ` + commandUser + `, command: ["` + hello + `"], max_attempts: 1 }
  granted: { user: ` + commandUser + `, command: ["` + aclHello + `"], max_attempts: 1 }
`)
	w := &world{Env: env, cfg: cfg}
	sup := w.Start(cfg, "supervisor")
	sup.WaitReady(t, 30*time.Second)
	why := "user " + commandUser + " (uid " + u.Uid + ") cannot run " + hello + ": permission denied on " + private +
		" (make it searchable by " + commandUser + ", or give the kind a user that may)"
	testenv.Eventually(t, 30*time.Second, "the supervisor to say at its start that the kind's user cannot run its command", func() (bool, error) {
		log, err := os.ReadFile(sup.Log)
		return strings.Contains(string(log), `kind=hello error="`+why+`"`), err
	})
	if got := w.waitSettled(w.submitOf("granted"), time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("the command an ACL lets its user reach: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}

	id := w.submitOf("hello")
	testenv.Eventually(t, time.Minute, "dama status to say why the task waits", func() (bool, error) {
		res := w.DamaWith(cfg, []string{"COLUMNS=400"}, "status")
		row := lineWith(res.Stdout, "hello")
		return strings.Contains(row, "QUEUED") && strings.Contains(row, "waiting: kind hello: "+why+" on host "), fmt.Errorf("dama status:\n%s", res.Stdout)
	})
	// Tried again at each poll, and, once the host said why, launched no
	// more: no attempt spent, which would leave it FAILED (max_attempts
	// 1), and one task process's lines in the logs.
	testenv.Eventually(t, 30*time.Second, "several tries of the task", w.tried(id, 4))
	if got := w.task(id); got.Status != etlcontext.StatusQueued || got.Attempt != 0 {
		t.Errorf("after several tries: %s, attempt %d; want QUEUED, no attempt spent", got.Status, got.Attempt)
	}
	if log, err := os.ReadFile(sup.Log); err != nil || strings.Count(string(log), `msg="spawned task process" etl_context_id=`+strconv.FormatInt(id, 10)) != 1 {
		t.Errorf("task processes started for a task this host said it cannot run (%v), want one:\n%s", err, log)
	}
	// The operator opens the directory: the task runs, as its first attempt.
	if err := os.Chmod(private, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := w.waitSettled(id, time.Minute); got.Status != etlcontext.StatusDone || got.Attempt != 1 {
		t.Errorf("after the directory was opened: %s after %d attempts, want DONE after 1", got.Status, got.Attempt)
	}
	if log, err := os.ReadFile(protocol.LogPath(filepath.Join(env.Dir, "logs"), id)); err != nil || !strings.Contains(string(log), "hello from "+commandUser) {
		t.Errorf("the task's log (%v), want its command's line:\n%s", err, log)
	}
}
