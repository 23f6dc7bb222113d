package main

import (
	"context"
	"fmt"
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

// anotherHost skips the test where a supervisor cannot be given a host of
// its own (a PID namespace, which needs root).
func anotherHost(t *testing.T) {
	t.Helper()
	if out, err := exec.Command("unshare", "--pid", "--fork", "--mount-proc", "true").CombinedOutput(); err != nil {
		t.Skipf("another host needs unshare --pid (root): %v %s", err, out)
	}
}

// onOtherHost runs a command in a UTS namespace of its own, where the host
// name is name: a second host, as far as dama can tell.
func onOtherHost(t *testing.T, name string) []string {
	t.Helper()
	if out, err := exec.Command("unshare", "--uts", "true").CombinedOutput(); err != nil {
		t.Skipf("a second host name needs unshare --uts (root): %v %s", err, out)
	}
	return []string{"unshare", "--uts", "sh", "-c", `hostname "$0" && exec "$@"`, name}
}

// socketEnv returns a copy of env whose pool reaches the test's database
// over the server's Unix socket, which Silence does not cut, and that URL.
func socketEnv(t *testing.T, env *testenv.Env) (*testenv.Env, string) {
	t.Helper()
	sock, err := url.Parse(env.Server.SocketURL())
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	sock.Path = tcp.Path
	pool, err := pgxpool.New(context.Background(), sock.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	copied := *env
	copied.Pool = pool
	return &copied, sock.String()
}

// twoHosts is a beat task run by supervisor A, whose processes reach the
// server over TCP, beside supervisor B on another host (a PID namespace of
// its own) that reaches it over its Unix socket: silencing the server's
// TCP port cuts A off and leaves B.
type twoHosts struct {
	*beatWorld
	srv *testenv.Server
	// viaSocket is the environment of a dama command that reaches the
	// server as B does.
	viaSocket []string
	id        int64
	// first is the task as attempt 1 runs it, beating, on A.
	first etlcontext.Task
}

func newTwoHosts(t *testing.T, extra string) *twoHosts {
	t.Helper()
	anotherHost(t)
	srv := testenv.NewServer(t)
	env, socketURL := socketEnv(t, testenv.NewOn(t, srv))
	w := newBeatWorld(t, env, extra)
	w.Start(w.cfg, "supervisor")
	id := w.submit()
	first := (&world{Env: env}).waitRunning(id)
	testenv.Eventually(t, 20*time.Second, "the worker to beat", func() (bool, error) { return len(w.beats(id)[1]) >= 3, nil })
	viaSocket := []string{"DATABASE_URL=" + socketURL}
	env.StartWith(w.cfg, viaSocket, []string{"unshare", "--pid", "--fork", "--mount-proc"}, "supervisor")
	return &twoHosts{beatWorld: w, srv: srv, viaSocket: viaSocket, id: id, first: first}
}

func TestSilentLockConnectionIsFencedBeforeARetryElsewhere(t *testing.T) {
	testenv.LockModes(t, testSilentLockConnectionIsFencedBeforeARetryElsewhere)
}

func testSilentLockConnectionIsFencedBeforeARetryElsewhere(t *testing.T) {
	h := newTwoHosts(t, "reconnect_grace: 3s")
	w, env, id, first := h.beatWorld, h.Env, h.id, h.first
	// Every TCP packet to or from the server is dropped: no reset, no FIN.
	testenv.Silence(t, h.srv.Port())
	silencedAt := time.Now()

	got := (&world{Env: env}).waitSettled(id, 120*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	if deref(got.HostID) == deref(first.HostID) {
		t.Errorf("attempt 2 ran on host %v, the host of attempt 1: want supervisor B's", deref(got.HostID))
	}
	w.assertNoOverlap(t, id)
	t.Logf("attempt 1's last beat %s after the silence; attempt 2 started %s after it",
		time.Duration(slices.Max(w.beats(id)[1])-silencedAt.UnixNano()).Round(time.Millisecond),
		time.Duration(startNS(w.starts(id)[1])-silencedAt.UnixNano()).Round(time.Millisecond))
}

func startNS(start []string) int64 {
	ns, _ := strconv.ParseInt(start[2], 10, 64)
	return ns
}

// A task whose lock connection went silent on its host is cancelled from
// elsewhere once its lock is free, then retried: the retry on another host
// does not start until the first attempt's command has surely stopped.
func TestCancelThenRetryWaitsOutTheFenceElsewhere(t *testing.T) {
	testenv.LockModes(t, testCancelThenRetryWaitsOutTheFenceElsewhere)
}

func testCancelThenRetryWaitsOutTheFenceElsewhere(t *testing.T) {
	// The command outlives the silence by reconnect_grace: long enough
	// for the server to free the lock (25 s of keepalives) well before it
	// stops.
	h := newTwoHosts(t, "reconnect_grace: 40s")
	w, env, id, first, viaSocket := h.beatWorld, h.Env, h.id, h.first, h.viaSocket
	testenv.Silence(t, h.srv.Port())
	(&world{Env: env}).waitFor(id, 60*time.Second, "to have its lock freed by the server", func(t etlcontext.Task) bool { return !t.InitialEventLocked })
	// The cancel ends once the attempt is surely over: a fencing window.
	// A shorter wait ends first, the cancellation requested: 10 s, long
	// enough to connect and ask on a busy machine, far shorter than the
	// window (reconnect_grace alone is 40 s).
	short := env.DamaWith(w.cfg, viaSocket, "cancel", strconv.FormatInt(id, 10), "--wait", "10s")
	if short.Code != 22 || !strings.Contains(short.Stderr, "once its attempt has surely stopped") {
		t.Fatalf("cancel --wait 10s: exit %d, %q; want 22, the cancellation pending", short.Code, short.Stderr)
	}
	cancel := env.StartWith(w.cfg, viaSocket, nil, "cancel", strconv.FormatInt(id, 10), "--wait", "3m")
	if err := cancel.Wait(); err != nil {
		log, _ := os.ReadFile(cancel.Log)
		t.Fatalf("cancel: %v: %s", err, log)
	}
	if got := (&world{Env: env}).task(id); got.Status != etlcontext.StatusCancelled {
		t.Fatalf("after dama cancel: %s, want CANCELLED", got.Status)
	}
	res := env.DamaWith(w.cfg, viaSocket, "retry", strconv.FormatInt(id, 10))
	if res.Code != 0 {
		t.Fatalf("retry: exit %d, %s", res.Code, res.Stderr)
	}
	got := (&world{Env: env}).waitSettled(id, 120*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Fatalf("%s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	if deref(got.HostID) == deref(first.HostID) {
		t.Errorf("attempt 2 ran on host %v, the host of attempt 1: want the other supervisor's", deref(got.HostID))
	}
	w.assertNoOverlap(t, id)
}

func TestAdoptionAndRetryAcrossHosts(t *testing.T) {
	testenv.LockModes(t, testAdoptionAndRetryAcrossHosts)
}

func testAdoptionAndRetryAcrossHosts(t *testing.T) {
	env := testenv.New(t)
	// In host lock mode one session holds the locks of all the host's
	// tasks: the adopted task holds its own, so that only the orphaned
	// task's lock is lost.
	mode, adoptedMode := "", ""
	if env.LockMode == config.LockModeHost {
		mode, adoptedMode = "lock_mode: host", "lock_mode: advisory"
	}
	cfg := env.WriteConfig(mode + `
log_dir: {{dir}}/logs
poll_interval: 300ms
heartbeat_interval: 200ms
kill_grace: 5s
reconnect_grace: 0s
kinds:
  stubborn:
    command: ["/bin/sh", "-c", "trap '' TERM; echo $$ $DAMA_ATTEMPT >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID; sleep 8"]
  stubborn_too:
    command: ["/bin/sh", "-c", "trap '' TERM; echo $$ $DAMA_ATTEMPT >> {{dir}}/starts-$DAMA_ETL_CONTEXT_ID; sleep 8"]
    ` + adoptedMode + `
`)
	w := &world{Env: env, cfg: cfg}
	other := onOtherHost(t, "dama-other-host")
	startLines := func(id int64) []string {
		data, _ := os.ReadFile(filepath.Join(env.Dir, fmt.Sprintf("starts-%d", id)))
		return strings.Fields(string(data))
	}
	submit := func(kind string) int64 {
		res := w.Dama(cfg, "submit", kind)
		if res.Code != 0 {
			t.Fatalf("submit: %s", res.Stderr)
		}
		return testenv.Atoi(t, res.Stdout)
	}

	remote := env.StartWrapped(cfg, other, "supervisor")
	adopted, orphaned := submit("stubborn_too"), submit("stubborn")
	for _, id := range []int64{adopted, orphaned} {
		if got := w.waitRunning(id); deref(got.Host) != "dama-other-host" {
			t.Fatalf("context %d runs on %v, want dama-other-host", id, deref(got.Host))
		}
		testenv.Eventually(t, 20*time.Second, "the command to start", func() (bool, error) { return len(startLines(id)) == 2, nil })
	}
	if err := syscall.Kill(-remote.Cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The orphaned task loses its lock while its command ignores SIGTERM:
	// it runs on for the kill grace, and this host cannot see its process.
	w.terminateLock(orphaned)
	oldPID, _ := strconv.Atoi(startLines(orphaned)[0])
	w.Start(cfg, "supervisor")
	noSecondStartWhileAlive(t, oldPID, func() []string { return startLines(orphaned) })

	if got := w.waitSettled(adopted, 60*time.Second); got.Status != etlcontext.StatusDone || got.Attempt != 1 || len(startLines(adopted)) != 2 {
		t.Errorf("adopted task: %s after %d attempts, starts %v; want DONE after a single start", got.Status, got.Attempt, startLines(adopted))
	}
	got := w.waitSettled(orphaned, 60*time.Second)
	if got.Status != etlcontext.StatusDone || got.Attempt != 2 {
		t.Errorf("orphaned task: %s after %d attempts, want DONE after 2", got.Status, got.Attempt)
	}
	host, _ := os.Hostname()
	if deref(got.Host) != host {
		t.Errorf("the retry ran on %v, want this host %s", deref(got.Host), host)
	}
}
