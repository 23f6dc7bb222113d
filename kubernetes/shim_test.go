package kubernetes_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/kubernetes/shim"
	"github.com/dama-etl/dama/protocol"
)

// A pod's two containers, on this host: the task process (dama's
// container) and dama's shim as the first process of a PID namespace of
// its own (the user's container), which share a directory (the pod's
// emptyDir) and nothing else. The task process gets its secrets from a
// file, as a pod's from its Secret.
type podWorld struct {
	*testenv.Env
	cfg string
	// run is the directory the two share; marker, a word the command's
	// processes carry in their arguments, to find any left over.
	run    string
	marker string
	// digest, when set, is the secrets' digest given the task process
	// instead of theirs.
	digest string
}

const podConfig = `
log_dir: {{dir}}/logs
heartbeat_interval: 200ms
progress_interval: 100ms
kinds:
  pod:
    kill_grace: 2s
    max_attempts: 1
    command:
      - /bin/sh
      - -c
      - |
        echo "db=${DATABASE_URL:-none} pg=${PGPASSWORD:-none} path=$PATH run=$DAMA_RUN_ID args=$DAMA_ARGS"
        echo '{"type": "progress", "payload": {"step": 1}}' >&3
        echo '{"type": "loaded", "payload": {"rows": 42}}' >&3
        sh -c 'sleep 1000' %[1]s-straggler &
        trap 'exit 143' TERM
        case "$DAMA_ARGS" in
          *wait*) echo waiting; while :; do sleep 0.2; done ;;
          *flood*) yes flood | head -c 4000000 ;;
        esac
        exit 3
  missing:
    max_attempts: 1
    command: ["/no/such/program"]
`

func newPodWorld(t *testing.T) *podWorld {
	if os.Geteuid() != 0 {
		t.Skip("a PID namespace of its own for the shim needs root")
	}
	t.Parallel()
	env := testenv.New(t)
	// A pod's two processes and the shim's protocol: watched for races.
	env.WithRaceDetector()
	marker := "dama-pod-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// Short: a socket's path is at most 107 bytes.
	run, err := os.MkdirTemp("", "dama-pod-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(run) })
	return &podWorld{Env: env, cfg: env.WriteConfig(fmt.Sprintf(podConfig, marker)), run: run, marker: marker}
}

// launch prepares an attempt of task id as a supervisor's step does, and
// starts its task process as a pod's dama container does, with the
// attempt's secrets in a file.
func (w *podWorld) launch(id int64) (*testenv.Proc, etlcontext.Run) {
	w.T.Helper()
	run := w.Launch(id)
	secrets, err := protocol.Secrets{Env: []string{protocol.DatabaseURLEnv + "=" + w.URL}, RunKey: run.Key}.Encode()
	if err != nil {
		w.T.Fatal(err)
	}
	secretsFile := filepath.Join(w.Dir, "secrets")
	if err := os.WriteFile(secretsFile, secrets, 0o600); err != nil {
		w.T.Fatal(err)
	}
	cfg, err := os.ReadFile(w.cfg)
	if err != nil {
		w.T.Fatal(err)
	}
	digest := w.digest
	if digest == "" {
		digest = protocol.PodDigest(secrets, cfg)
	}
	holder := w.StartProgramWith(w.TaskRunnerBin, w.cfg, []string{protocol.ProcessEnv + "=" + protocol.ProcessRunner},
		"taskrunner", "--context-id", strconv.FormatInt(id, 10), "--run-id", run.ID,
		"--secrets-file", secretsFile, "--secrets-digest", digest, shim.SocketFlag, filepath.Join(w.run, shim.Socket))
	return holder, run
}

// shimProc is the shim, the first process of its PID namespace.
type shimProc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startShim starts the shim with an environment of the user's container's
// own: no database URL (its PGPASSWORD is the user's).
func (w *podWorld) startShim() *shimProc {
	w.T.Helper()
	log := filepath.Join(w.Dir, "shim.log")
	f, err := os.Create(log)
	if err != nil {
		w.T.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(w.ShimBin, filepath.Join(w.run, shim.Socket))
	// GORACE: the race detector's options (testenv.Main's), or its second
	// of sleep before the shim exits.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "PGPASSWORD=the-users-own", w.Tag(), "GORACE=" + os.Getenv("GORACE")}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID, Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.T.Fatalf("start dama-shim: %v", err)
	}
	p := &shimProc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	w.T.Cleanup(func() {
		// The first process of its namespace: every other goes with it.
		_ = cmd.Process.Kill()
		<-p.done
		if w.T.Failed() {
			out, _ := os.ReadFile(log)
			w.T.Logf("log of dama-shim:\n%s", out)
		}
	})
	return p
}

// exit waits for the shim's exit, and returns its code.
func (p *shimProc) exit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(within):
		t.Fatalf("dama-shim still runs after %s", within)
	}
	var exitErr *exec.ExitError
	if errors.As(p.err, &exitErr) {
		return exitErr.ExitCode()
	}
	return 0
}

// exitOf waits, at most a minute, for p's exit and returns its code.
func exitOf(t *testing.T, p *testenv.Proc) int {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		t.Fatalf("%v still runs after a minute", p.Cmd.Args)
	}
	return p.Cmd.ProcessState.ExitCode()
}

// leftOver returns the pids of this host's processes whose arguments
// carry the world's marker.
func (w *podWorld) leftOver() []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline")); err == nil && strings.Contains(string(b), w.marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func TestAPodsCommandRunsUnderTheShimWithoutTheSecrets(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod", "--args", `{"n": 1}`).Stdout)
	holder, run := w.launch(id)
	sh := w.startShim()

	if code := exitOf(t, holder); code != protocol.ExitFailed {
		t.Fatalf("task process: exit %d, want %d", code, protocol.ExitFailed)
	}
	if code := sh.exit(t, 10*time.Second); code != 3 {
		t.Errorf("dama-shim: exit %d, want the command's 3", code)
	}
	if left := w.leftOver(); len(left) > 0 {
		t.Errorf("the command's processes %v outlived it", left)
	}
	task, err := etlcontext.Get(context.Background(), w.Pool, id)
	if err != nil {
		t.Fatal(err)
	}
	if task.Status != etlcontext.StatusFailed {
		t.Errorf("status %s, want FAILED", task.Status)
	}
	var reason, exit string
	if err := w.Pool.QueryRow(context.Background(), `SELECT payload->>'reason', payload->>'exit' FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'pod:ERROR'`, id).Scan(&reason, &exit); err != nil {
		t.Fatal(err)
	}
	// Without a failure line, the command's last line is the reason.
	if exit != "command exited with code 3" || !strings.HasPrefix(reason, "db=none pg=") {
		t.Errorf("ERROR's reason %q, exit %q: want the command's last line and its exit", reason, exit)
	}
	var rows int
	if err := w.Pool.QueryRow(context.Background(), `SELECT (payload->>'rows')::int FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'pod:LOADED'`, id).Scan(&rows); err != nil || rows != 42 {
		t.Errorf("the command's LOADED event: rows %d, %v", rows, err)
	}
	// The command's output: in the log file (dama logs), and on the task
	// process's stdout (the container's log, kubectl logs).
	want := fmt.Sprintf(`db=none pg=the-users-own path=/usr/bin:/bin run=%s args={"n": 1}`, run.ID)
	logFile, _ := os.ReadFile(protocol.LogPath(filepath.Join(w.Dir, "logs"), id))
	containerLog, _ := os.ReadFile(holder.Log)
	for name, out := range map[string]string{"log file": string(logFile), "task process's output": string(containerLog)} {
		if !strings.Contains(out, want) {
			t.Errorf("%s lacks %q:\n%s", name, want, out)
		}
		if !strings.Contains(out, "command exited") {
			t.Errorf("%s lacks the task process's own lines:\n%s", name, out)
		}
	}
	if _, err := os.Stat(filepath.Join(w.run, shim.Socket)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket is still there once the shim connected: %v", err)
	}
}

func TestAPodsCommandStopsWhenItsTaskProcessIsKilled(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod", "--args", `{"wait": true}`).Stdout)
	holder, _ := w.launch(id)
	sh := w.startShim()
	w.waitLog(id, "waiting")

	holder.Kill(t, syscall.SIGKILL)
	// TERM first, which the command's trap answers.
	if code := sh.exit(t, 30*time.Second); code != 143 {
		t.Errorf("dama-shim: exit %d, want the command's 143", code)
	}
	if left := w.leftOver(); len(left) > 0 {
		t.Errorf("the command's processes %v outlived the task process", left)
	}
	if log, _ := os.ReadFile(sh.log); !strings.Contains(string(log), "the task process went away; stopping the command") {
		t.Errorf("the shim's log does not say why it stopped the command:\n%s", log)
	}
}

func TestAPodsCancelStopsTheCommandThroughTheShim(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod", "--args", `{"wait": true}`).Stdout)
	holder, _ := w.launch(id)
	sh := w.startShim()
	w.waitLog(id, "waiting")
	// The command may signal its container's first process: what Go's
	// runtime dies of must not end the shim before the command.
	for _, sig := range []syscall.Signal{syscall.SIGQUIT, syscall.SIGABRT, syscall.SIGSEGV} {
		if err := sh.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
	}

	if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("cancel: exit %d: %s", res.Code, res.Stderr)
	}
	if code := exitOf(t, holder); code != protocol.ExitCancelled {
		t.Errorf("task process: exit %d, want %d", code, protocol.ExitCancelled)
	}
	if code := sh.exit(t, 10*time.Second); code != 143 {
		t.Errorf("dama-shim: exit %d, want the command's 143", code)
	}
	if task, err := etlcontext.Get(context.Background(), w.Pool, id); err != nil || task.Status != etlcontext.StatusCancelled {
		t.Errorf("status %v (%v), want CANCELLED", task.Status, err)
	}
	if left := w.leftOver(); len(left) > 0 {
		t.Errorf("the command's processes %v outlived the cancel", left)
	}
}

func TestAPodWhoseImageLacksTheCommandIsUnfit(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "missing").Stdout)
	holder, _ := w.launch(id)
	sh := w.startShim()
	if code := exitOf(t, holder); code != protocol.ExitUnfit {
		t.Errorf("task process: exit %d, want %d", code, protocol.ExitUnfit)
	}
	if code := sh.exit(t, 10*time.Second); code != shim.ExitNoCommand {
		t.Errorf("dama-shim: exit %d, want %d", code, shim.ExitNoCommand)
	}
	var reason string
	if err := w.Pool.QueryRow(context.Background(), `SELECT payload->>'reason' FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'missing:WARNING'`, id).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(reason, "/no/such/program not found in the task's container") {
		t.Errorf("WARNING's reason %q", reason)
	}
}

// waitLog waits for a line that is text alone in task id's log: what the
// command printed, not the runner's line quoting the command.
func (w *podWorld) waitLog(id int64, text string) {
	w.T.Helper()
	path := protocol.LogPath(filepath.Join(w.Dir, "logs"), id)
	testenv.Eventually(w.T, time.Minute, "the log to say "+text, func() (bool, error) {
		b, err := os.ReadFile(path)
		return slices.Contains(strings.Split(string(b), "\n"), text), err
	})
}

func TestAPodsTaskProcessWaitsOutAStepHoldingItsLock(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod").Stdout)
	// A supervisor's step holds the task's lock while it reads the pod
	// from Kubernetes: a task process that gave up at once would cost
	// the launch its pod.
	ctx := context.Background()
	tx, err := w.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	holder, _ := w.launch(id)
	if _, err := etlcontext.Lock(ctx, tx, id); err != nil {
		t.Fatal(err)
	}
	sh := w.startShim()
	testenv.Eventually(t, time.Minute, "the task process to find its lock held", func() (bool, error) {
		b, err := os.ReadFile(holder.Log)
		return err == nil && strings.Contains(string(b), "trying again"), nil
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if code := exitOf(t, holder); code != protocol.ExitFailed {
		t.Fatalf("task process: exit %d, want %d once the step let go of its lock", code, protocol.ExitFailed)
	}
	if code := sh.exit(t, 10*time.Second); code != 3 {
		t.Errorf("dama-shim: exit %d, want the command's 3", code)
	}
}

func TestAPodsCommandOutlivesAFullLogVolume(t *testing.T) {
	w := newPodWorld(t)
	// The pod's log volume, full after 64 KiB of the command's 4 MB.
	logs := filepath.Join(w.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", logs).CombinedOutput(); err != nil {
		t.Fatalf("mount a small tmpfs: %v\n%s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", logs).Run() })
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod", "--args", `{"flood": true}`).Stdout)
	holder, _ := w.launch(id)
	sh := w.startShim()
	if code := exitOf(t, holder); code != protocol.ExitFailed {
		t.Fatalf("task process: exit %d, want %d: the command's exit recorded", code, protocol.ExitFailed)
	}
	if code := sh.exit(t, 10*time.Second); code != 3 {
		t.Errorf("dama-shim: exit %d, want the command's 3", code)
	}
}

func TestAPodsTaskProcessRunsOnlyItsSupervisorsSecret(t *testing.T) {
	w := newPodWorld(t)
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "pod").Stdout)
	// The pod's spec names its supervisor's Secret by digest: one that
	// someone else made under its name first is not run.
	w.digest = protocol.PodDigest([]byte("someone else's"), nil)
	holder, _ := w.launch(id)
	sh := w.startShim()
	if code := exitOf(t, holder); code != protocol.ExitSetup {
		t.Errorf("task process: exit %d, want %d", code, protocol.ExitSetup)
	}
	if out, _ := os.ReadFile(holder.Log); !strings.Contains(string(out), "not its supervisor's (their digest differs)") {
		t.Errorf("the task process does not say why it stopped:\n%s", out)
	}
	// The shim waits for a socket no one listens on (it gives up after
	// its --wait): the command never started.
	select {
	case <-sh.done:
		t.Errorf("dama-shim exited: %v", sh.err)
	default:
	}
	if left := w.leftOver(); len(left) > 0 {
		t.Errorf("processes of the command run: %v", left)
	}
	if task, err := etlcontext.Get(context.Background(), w.Pool, id); err != nil || task.PID != nil {
		t.Errorf("the task's process was recorded: %+v, %v", task, err)
	}
}
