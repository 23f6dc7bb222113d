package main

import (
	"context"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/taskrunner/protocol"
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
