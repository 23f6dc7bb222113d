package kubernetes_test

import (
	"cmp"
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

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	policyv1client "k8s.io/client-go/kubernetes/typed/policy/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/kubernetes"
)

// The tests on a real cluster: scripts/test-kubernetes.sh starts one
// (scripts/kube.sh), with the test server on the node's address, and
// runs them. Elsewhere they are skipped.
const (
	// kubeDBAddrEnv is where the pods reach the test server (host:port);
	// kubeDBPasswordEnv, its postgres role's password.
	kubeDBAddrEnv     = "DAMA_TEST_KUBE_DB_ADDR"
	kubeDBPasswordEnv = "DAMA_TEST_KUBE_DB_PASSWORD"
)

type kubeWorld struct {
	*testenv.Env
	ns     string
	core   corev1client.CoreV1Interface
	policy policyv1client.PolicyV1Interface
	// cfg is the configuration on this host (dama submit, logs); the
	// supervisor's pod has the same in its ConfigMap.
	cfg string
}

const kubeConfig = `
log_dir: /var/log/dama
poll_interval: 1s
# A task process cut off from the database stops its command after 15s
# (TestALostNodesTaskIsRetriedOnKubernetes waits that out).
reconnect_grace: 15s
kubernetes: {image: "dama:dev"}
queues:
  etl: {max_running: 20}
kinds:
  sleeper:
    queue: etl
    runner: kubernetes
    max_attempts: 3
    command:
      - sh
      - -c
      - |
        s=${DAMA_ARGS#*:}; s=${s%%\}}
        echo "hello from $HOSTNAME, attempt $DAMA_ATTEMPT"
        echo '{"type": "progress", "payload": {"sleeping": true}}' >&3
        sleep $s
        echo "bye from $HOSTNAME"
    pod:
      spec:
        containers:
          - name: task
            image: dama/task:dev
            resources: {limits: {memory: 64Mi}}
  hog:
    queue: etl
    runner: kubernetes
    max_attempts: 1
    command: [sh, -c, 'echo eating; exec dd if=/dev/zero of=/dev/null bs=200M count=1']
    pod:
      spec:
        containers: [{name: task, image: "dama/task:dev", resources: {limits: {memory: 48Mi}}}]
  resumable:
    queue: etl
    runner: kubernetes
    max_attempts: 3
    command:
      - sh
      - -c
      - |
        echo "attempt $DAMA_ATTEMPT from checkpoint [$DAMA_CHECKPOINT]"
        echo '{"type": "checkpoint", "payload": {"done": 1}}' >&3
        while :; do sleep 0.2; done
    pod:
      spec:
        containers: [{name: task, image: "dama/task:dev"}]
  missing:
    queue: etl
    runner: kubernetes
    start_timeout: 10s
    command: ["true"]
    pod:
      spec:
        containers: [{name: task, image: "dama/no-such-image:dev", imagePullPolicy: Never}]
`

func newKubeWorld(t *testing.T) *kubeWorld {
	addr, password := os.Getenv(kubeDBAddrEnv), os.Getenv(kubeDBPasswordEnv)
	if addr == "" || os.Getenv("KUBECONFIG") == "" {
		t.Skip("no cluster: scripts/test-kubernetes.sh runs the tests on Kubernetes")
	}
	env := testenv.New(t)
	rc, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	policy, err := policyv1client.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	w := &kubeWorld{Env: env, core: core, policy: policy, ns: "dama-e2e-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
	w.cfg = env.WriteConfig(strings.Replace(kubeConfig, "log_dir: /var/log/dama", "log_dir: "+filepath.Join(env.Dir, "logs"), 1))
	ctx := context.Background()
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := w.kubectl("get", "pods", "-o", "wide")
			t.Logf("pods:\n%s", out)
			logs, _ := w.kubectl("logs", "-l", "app.kubernetes.io/component=supervisor", "--tail=60", "--prefix")
			t.Logf("supervisors' logs:\n%s", logs)
		}
		_ = core.Namespaces().Delete(context.Background(), w.ns, metav1.DeleteOptions{})
	})
	// The pods' URL: the test's database through the node's address.
	u, err := url.Parse(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	podURL := fmt.Sprintf("postgres://postgres:%s@%s%s?sslmode=disable", url.QueryEscape(password), addr, u.Path)
	if _, err := core.Secrets(w.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "dama-database"}, StringData: map[string]string{"url": podURL}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The default service account, which the supervisor's is beside,
	// exists once the controller manager made the namespace's.
	testenv.Eventually(t, time.Minute, "the namespace's service account", func() (bool, error) {
		_, err := core.ServiceAccounts(w.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})
	return w
}

// kubectl runs kubectl in the world's namespace.
func (w *kubeWorld) kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "kubectl", append([]string{"-n", w.ns}, args...)...).CombinedOutput()
	return string(out), err
}

// deploy applies deploy/kubernetes, as a user would, through an overlay
// with the world's configuration, and waits for it to be rolled out.
func (w *kubeWorld) deploy() {
	w.T.Helper()
	w.apply()
	w.rolledOut()
}

// apply applies deploy/kubernetes through an overlay with the world's
// configuration.
func (w *kubeWorld) apply() {
	w.T.Helper()
	dir := filepath.Join(w.Dir, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.T.Fatal(err)
	}
	base, err := filepath.Abs("../deploy/kubernetes")
	if err != nil {
		w.T.Fatal(err)
	}
	rel, err := filepath.Rel(dir, base)
	if err != nil {
		w.T.Fatal(err)
	}
	kustomization := fmt.Sprintf(`namespace: %s
resources: [%s]
configMapGenerator:
  - name: dama-config
    behavior: replace
    files: [dama.yaml]
`, w.ns, rel)
	for name, content := range map[string]string{"kustomization.yaml": kustomization, "dama.yaml": kubeConfig} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			w.T.Fatal(err)
		}
	}
	// The database is migrated already: the migration's Job is left out.
	if out, err := w.kubectl("apply", "-k", dir, "-l", "app.kubernetes.io/component!=migrate"); err != nil {
		w.T.Fatalf("kubectl apply -k: %v\n%s", err, out)
	}
}

// rolledOut waits for the supervisor's Deployment to be rolled out.
func (w *kubeWorld) rolledOut() {
	w.T.Helper()
	if out, err := w.kubectl("rollout", "status", "deployment/dama-supervisor", "--timeout=150s"); err != nil {
		w.T.Fatalf("rollout status: %v\n%s", err, out)
	}
}

// TestRolloutStatusWaitsForTheSupervisorOnKubernetes: the supervisor's
// pod is ready once the supervisor works (its startup probe, dama ready),
// so that kubectl rollout status returns then, and a roll keeps the old
// supervisor until then: not while it waits for a database it cannot
// reach.
func TestRolloutStatusWaitsForTheSupervisorOnKubernetes(t *testing.T) {
	w := newKubeWorld(t)
	ctx := context.Background()
	secrets := w.core.Secrets(w.ns)
	secret, err := secrets.Get(ctx, "dama-database", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	good := secret.Data["url"]
	// The node's address, on a port where nothing listens.
	secret.Data["url"] = []byte("postgres://postgres@" + strings.Split(os.Getenv(kubeDBAddrEnv), ":")[0] + ":1/postgres?sslmode=disable&connect_timeout=2")
	if secret, err = secrets.Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.apply()
	began := time.Now()
	if out, err := w.kubectl("rollout", "status", "deployment/dama-supervisor", "--timeout=20s"); err == nil {
		t.Fatalf("rollout status returned %s after the apply, for a supervisor that cannot reach its database:\n%s", time.Since(began).Round(time.Millisecond), out)
	}
	testenv.Eventually(t, time.Minute, "the startup probe to say why", func() (bool, error) {
		out, err := w.kubectl("get", "events", "--field-selector", "reason=Unhealthy", "-o", "jsonpath={.items[*].message}")
		return strings.Contains(out, "is not ready: it waits for the database"), fmt.Errorf("events %q: %v", out, err)
	})
	if out, _ := w.kubectl("get", "pods", "-l", "app.kubernetes.io/component=supervisor", "-o", "jsonpath={.items[*].status.containerStatuses[*].ready}"); out != "false" {
		t.Errorf("the supervisor's pod, waiting for its database: ready %q, want false", out)
	}

	secret.Data["url"] = good
	if _, err := secrets.Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if out, err := w.kubectl("rollout", "restart", "deployment/dama-supervisor"); err != nil {
		t.Fatalf("rollout restart: %v\n%s", err, out)
	}
	w.rolledOut()
	// It works: it holds its liveness lock.
	var n int
	if err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'dama-supervisor-liveness:%'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("when rollout status returned, %d supervisors held their liveness lock (%v), want 1", n, err)
	}
}

// taskPods returns the names of task id's pods.
func (w *kubeWorld) taskPods(id int64) []string {
	w.T.Helper()
	list, err := w.core.Pods(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: kubernetes.LabelTask + "=" + strconv.FormatInt(id, 10)})
	if err != nil {
		w.T.Fatal(err)
	}
	var names []string
	for _, p := range list.Items {
		names = append(names, p.Name)
	}
	return names
}

// TestARolledSupervisorLeavesItsTasksPodsRunningOnKubernetes is the promise on
// Kubernetes: the supervisor's Deployment is rolled three times while
// tasks run in pods of their own, and each task ends DONE at attempt 1,
// with one pod.
func TestARolledSupervisorLeavesItsTasksPodsRunningOnKubernetes(t *testing.T) {
	w := newKubeWorld(t)
	w.deploy()
	const tasks = 4
	var ids []int64
	for range tasks {
		ids = append(ids, testenv.Atoi(t, w.Dama(w.cfg, "submit", "sleeper", "--args", `{"seconds": 75}`).Stdout))
	}
	for _, id := range ids {
		w.WaitForTask(id, 3*time.Minute, "running in its pod", func(task etlcontext.Task) bool {
			return task.Status == etlcontext.StatusRunning && task.InitialEventLocked && task.PID != nil
		})
	}
	// Each running pod's server connections, by name.
	var conns int
	if err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'dama-task%'`).Scan(&conns); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d running pods hold %d server connections (lock mode row)", tasks, conns)
	for i := range 3 {
		began := time.Now()
		var dbBegan time.Time
		if err := w.Pool.QueryRow(context.Background(), `SELECT now()`).Scan(&dbBegan); err != nil {
			t.Fatal(err)
		}
		if out, err := w.kubectl("rollout", "restart", "deployment/dama-supervisor"); err != nil {
			t.Fatalf("rollout restart: %v\n%s", err, out)
		}
		w.rolledOut()
		rolled := time.Since(began)
		// Adopted: each task's job fetched again since the roll began,
		// by the new supervisor, and held.
		testenv.Eventually(t, 2*time.Minute, "the tasks adopted", func() (bool, error) {
			var n int
			err := w.Pool.QueryRow(context.Background(), `SELECT count(*) FROM data_manager.etl_contexts c JOIN river_job j ON j.id = c.river_job_id
				WHERE c.etl_context_id = ANY($1) AND j.state = 'running' AND j.attempted_at > $2`, ids, dbBegan).Scan(&n)
			return n == tasks, fmt.Errorf("%d of %d adopted (%v)", n, tasks, err)
		})
		t.Logf("roll %d: rolled out in %s, every task adopted %s after the roll began", i+1, rolled.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
		for _, id := range ids {
			if task := w.WaitForTask(id, time.Minute, "", func(etlcontext.Task) bool { return true }); task.Status != etlcontext.StatusRunning || !task.InitialEventLocked {
				t.Fatalf("roll %d: task %d is %s (locked %t)", i+1, id, task.Status, task.InitialEventLocked)
			}
		}
	}
	for _, id := range ids {
		task := w.WaitForTask(id, 4*time.Minute, "DONE", func(task etlcontext.Task) bool { return task.Status.Finished() })
		if task.Status != etlcontext.StatusDone || task.Attempt != 1 {
			t.Errorf("task %d: %s at attempt %d, want DONE at attempt 1", id, task.Status, task.Attempt)
		}
		if pods := w.taskPods(id); len(pods) != 1 {
			t.Errorf("task %d ran in pods %v, want one", id, pods)
		} else if out, err := w.kubectl("logs", pods[0]); err != nil || !strings.Contains(out, "bye from "+pods[0]) {
			t.Errorf("kubectl logs %s: %v\n%s", pods[0], err, out)
		}
		if res := w.Dama(w.cfg, "logs", strconv.FormatInt(id, 10)); !strings.Contains(res.Stdout, "hello from dama-"+strconv.FormatInt(id, 10)) {
			t.Errorf("dama logs %d: exit %d\n%s%s", id, res.Code, res.Stdout, res.Stderr)
		}
	}
	// The job of each agrees.
	var jobs []string
	rows, err := w.Pool.Query(context.Background(), `SELECT j.state::text FROM data_manager.etl_contexts c JOIN river_job j ON j.id = c.river_job_id WHERE c.etl_context_id = ANY($1)`, ids)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, s)
	}
	if slices.ContainsFunc(jobs, func(s string) bool { return s != "completed" }) || len(jobs) != tasks {
		t.Errorf("jobs %v, want %d completed", jobs, tasks)
	}
}

// TestWhatKubernetesAddsOnKubernetes: a pod that cannot start, a command
// out of memory, a cancel, a deleted pod.
func TestWhatKubernetesAddsOnKubernetes(t *testing.T) {
	w := newKubeWorld(t)
	w.deploy()
	ctx := context.Background()
	submit := func(kind string, args ...string) int64 {
		return testenv.Atoi(t, w.Dama(w.cfg, append([]string{"submit", kind}, args...)...).Stdout)
	}
	resumable := submit("resumable")
	missing := submit("missing")
	hog := submit("hog")
	cancelled := submit("sleeper", "--args", `{"seconds": 600}`)
	deleted := submit("sleeper", "--args", `{"seconds": 600}`)
	running := func(id int64, attempt int) etlcontext.Task {
		return w.WaitForTask(id, 3*time.Minute, fmt.Sprintf("running attempt %d in its pod", attempt), func(task etlcontext.Task) bool {
			return task.Status == etlcontext.StatusRunning && task.InitialEventLocked && task.PID != nil && task.Attempt == attempt
		})
	}
	eventReason := func(id int64, suffix string) string {
		var reason string
		_ = w.Pool.QueryRow(ctx, `SELECT coalesce(string_agg(payload->>'reason', ' | '), '') FROM data_manager.event_store WHERE etl_context_id = $1 AND type LIKE '%:' || $2`, id, suffix).Scan(&reason)
		return reason
	}

	t.Run("a pod that cannot start is deleted, its launch given back", func(t *testing.T) {
		testenv.Eventually(t, 2*time.Minute, "the WARNING of a pod that did not start", func() (bool, error) {
			r := eventReason(missing, "WARNING")
			return strings.Contains(r, "ErrImageNeverPull"), fmt.Errorf("warnings: %q", r)
		})
		task := w.WaitForTask(missing, time.Minute, "its launch given back", func(task etlcontext.Task) bool { return task.Status == etlcontext.StatusQueued })
		if task.Attempt != 0 {
			t.Errorf("attempt %d: a launch that never ran spent an attempt", task.Attempt)
		}
		t.Logf("warning: %s", eventReason(missing, "WARNING"))
		if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(missing, 10)); res.Code != 0 {
			t.Fatalf("cancel: %d %s", res.Code, res.Stderr)
		}
		w.WaitForTask(missing, 2*time.Minute, "CANCELLED", func(task etlcontext.Task) bool { return task.Status == etlcontext.StatusCancelled })
	})

	t.Run("a command out of memory says so", func(t *testing.T) {
		task := w.WaitForTask(hog, 3*time.Minute, "FAILED", func(task etlcontext.Task) bool { return task.Status.Finished() })
		// As dama status says it: how the command ended leads its last words.
		f, err := etlcontext.LastFailure(ctx, w.Pool, hog, task.Kind)
		if r := f.Reason; err != nil || task.Status != etlcontext.StatusFailed || !strings.Contains(r, "out of memory") {
			t.Errorf("%s: ERROR %q (%v), want FAILED out of memory", task.Status, r, err)
		} else {
			t.Logf("reason: %s", r)
		}
	})

	t.Run("cancel stops the command, then deletes the pod", func(t *testing.T) {
		running(cancelled, 1)
		// Named before the cancel, which deletes it.
		pods := w.taskPods(cancelled)
		if len(pods) != 1 {
			t.Fatalf("pods %v", pods)
		}
		if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(cancelled, 10)); res.Code != 0 {
			t.Fatalf("cancel: %d %s", res.Code, res.Stderr)
		}
		w.WaitForTask(cancelled, 2*time.Minute, "CANCELLED", func(task etlcontext.Task) bool { return task.Status == etlcontext.StatusCancelled })
		testenv.Eventually(t, time.Minute, "the cancelled task's pod to be deleted", func() (bool, error) {
			pod, err := w.core.Pods(w.ns).Get(ctx, pods[0], metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				return true, nil
			}
			if err != nil {
				return false, err
			}
			return pod.DeletionTimestamp != nil, fmt.Errorf("phase %s", pod.Status.Phase)
		})
	})

	t.Run("a budget keeps evictions off; an evicted task resumes from its checkpoint", func(t *testing.T) {
		running(resumable, 1)
		testenv.Eventually(t, time.Minute, "the checkpoint stored", func() (bool, error) {
			var n int
			err := w.Pool.QueryRow(ctx, `SELECT count(*) FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'resumable:CHECKPOINT'`, resumable).Scan(&n)
			return n > 0, err
		})
		pods := w.taskPods(resumable)
		if len(pods) != 1 {
			t.Fatalf("pods %v", pods)
		}
		budget := &policyv1.PodDisruptionBudget{
			ObjectMeta: metav1.ObjectMeta{Name: "dama-tasks"},
			Spec: policyv1.PodDisruptionBudgetSpec{
				MaxUnavailable: new(intstr.FromInt32(0)),
				Selector:       &metav1.LabelSelector{MatchLabels: map[string]string{kubernetes.LabelManagedBy: "dama"}},
			},
		}
		if _, err := w.policy.PodDisruptionBudgets(w.ns).Create(ctx, budget, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		evict := func() error {
			return w.core.Pods(w.ns).EvictV1(ctx, &policyv1.Eviction{ObjectMeta: metav1.ObjectMeta{Name: pods[0], Namespace: w.ns}})
		}
		// The budget's controller must have counted the pods first.
		testenv.Eventually(t, time.Minute, "the budget to refuse the eviction", func() (bool, error) {
			err := evict()
			return apierrors.IsTooManyRequests(err), fmt.Errorf("eviction: %v", err)
		})
		if task := w.WaitForTask(resumable, time.Minute, "", func(etlcontext.Task) bool { return true }); task.Status != etlcontext.StatusRunning || task.Attempt != 1 {
			t.Fatalf("with the budget: %s at attempt %d", task.Status, task.Attempt)
		}
		if err := w.policy.PodDisruptionBudgets(w.ns).Delete(ctx, budget.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, time.Minute, "the eviction", func() (bool, error) {
			err := evict()
			return err == nil, fmt.Errorf("eviction: %v", err)
		})
		running(resumable, 2)
		testenv.Eventually(t, time.Minute, "attempt 2 to start from the checkpoint", func() (bool, error) {
			for _, p := range w.taskPods(resumable) {
				if out, _ := w.kubectl("logs", p); strings.Contains(out, `attempt 2 from checkpoint [{"done": 1}]`) {
					return true, nil
				}
			}
			return false, nil
		})
		if r := eventReason(resumable, "ERROR"); !strings.Contains(r, "its pod is stopping") {
			t.Errorf("attempt 1 ended: %q, want its pod's stopping", r)
		} else {
			t.Logf("attempt 1 ended: %s", r)
		}
		if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(resumable, 10)); res.Code != 0 {
			t.Fatalf("cancel: %d %s", res.Code, res.Stderr)
		}
	})

	t.Run("a deleted pod's task is retried in a new pod", func(t *testing.T) {
		first := running(deleted, 1)
		pods := w.taskPods(deleted)
		if len(pods) != 1 {
			t.Fatalf("pods %v", pods)
		}
		if out, err := w.kubectl("delete", "pod", pods[0], "--wait=false"); err != nil {
			t.Fatalf("delete pod: %v\n%s", err, out)
		}
		second := running(deleted, 2)
		if *second.RunID == *first.RunID {
			t.Error("the retry runs under the first attempt's run")
		}
		t.Logf("attempt 1 ended: %s", eventReason(deleted, "ERROR"))
		if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(deleted, 10)); res.Code != 0 {
			t.Fatalf("cancel: %d %s", res.Code, res.Stderr)
		}
		w.WaitForTask(deleted, 2*time.Minute, "CANCELLED", func(task etlcontext.Task) bool { return task.Status == etlcontext.StatusCancelled })
	})
}

// TestPodStartFiguresOnKubernetes measures a task's pod from its creation
// to its lock held, beside a bare pod of the same image from its
// creation to its container running, both as this test sees them (the
// API and the database polled every 10ms), one pod at a time.
func TestPodStartFiguresOnKubernetes(t *testing.T) {
	w := newKubeWorld(t)
	w.deploy()
	ctx := context.Background()
	// Polled every 10ms rather than watched: a watch that ends early
	// (the API server may close it) would miss a pod's start.
	const every = 10 * time.Millisecond
	const n = 5
	var bare, task []time.Duration
	for i := range n {
		name := fmt.Sprintf("bare-%d", i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, AutomountServiceAccountToken: new(false),
			Containers: []corev1.Container{{Name: "main", Image: "dama/task:dev", Command: []string{"sleep", "600"}}},
		}}
		created := time.Now()
		if _, err := w.core.Pods(w.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		testenv.EventuallyEvery(t, every, time.Minute, name+" running", func() (bool, error) {
			p, err := w.core.Pods(w.ns).Get(ctx, name, metav1.GetOptions{})
			return err == nil && len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].State.Running != nil, err
		})
		bare = append(bare, time.Since(created))
		if err := w.core.Pods(w.ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "sleeper", "--args", `{"seconds": 1}`).Stdout)
		testenv.EventuallyEvery(t, every, time.Minute, "the task's pod", func() (bool, error) { return len(w.taskPods(id)) == 1, nil })
		created := time.Now()
		testenv.EventuallyEvery(t, every, time.Minute, "the task's lock", func() (bool, error) {
			var ok bool
			err := w.Pool.QueryRow(ctx, `SELECT pid IS NOT NULL FROM data_manager.etl_contexts WHERE etl_context_id = $1`, id).Scan(&ok)
			return ok, err
		})
		task = append(task, time.Since(created))
		w.WaitForTask(id, time.Minute, "DONE", func(task etlcontext.Task) bool { return task.Status.Finished() })
	}
	slices.Sort(bare)
	slices.Sort(task)
	t.Logf("pod creation to running, a bare pod: p50 %s (min %s, max %s); to the lock held, a task's pod: p50 %s (min %s, max %s); %d each",
		bare[n/2].Round(time.Millisecond), bare[0].Round(time.Millisecond), bare[n-1].Round(time.Millisecond),
		task[n/2].Round(time.Millisecond), task[0].Round(time.Millisecond), task[n-1].Round(time.Millisecond), n)
}

// TestALostNodesTaskIsRetriedOnKubernetes loses the node of a running
// task's pod: its kubelet is killed, so that it stops reporting to
// Kubernetes while its containers run on, and then the pod's packets are
// dropped, so that the database hears nothing more of its task process,
// not even a reset. The attempt's death says the node was lost, and the
// retry waits for the pod's processes to be surely gone without
// Kubernetes' word (the fence window). It runs last: the node is down
// for minutes.
func TestALostNodesTaskIsRetriedOnKubernetes(t *testing.T) {
	w := newKubeWorld(t)
	w.deploy()
	ctx := context.Background()
	id := testenv.Atoi(t, w.Dama(w.cfg, "submit", "sleeper", "--args", `{"seconds": 600}`).Stdout)
	first := w.WaitForTask(id, 3*time.Minute, "running attempt 1 in its pod", func(task etlcontext.Task) bool {
		return task.Status == etlcontext.StatusRunning && task.InitialEventLocked && task.PID != nil
	})
	names := w.taskPods(id)
	if len(names) != 1 {
		t.Fatalf("pods %v", names)
	}
	var pod *corev1.Pod
	ready := func(want corev1.ConditionStatus) func() (bool, error) {
		return func() (bool, error) {
			var err error
			if pod, err = w.core.Pods(w.ns).Get(ctx, names[0], metav1.GetOptions{}); err != nil {
				return false, err
			}
			for _, c := range pod.Status.Conditions {
				if c.Type == corev1.PodReady {
					return c.Status == want, fmt.Errorf("ready %s", c.Status)
				}
			}
			return false, nil
		}
	}
	// The kubelet's last word must be that the pod runs.
	testenv.EventuallyEvery(t, 100*time.Millisecond, time.Minute, "the kubelet to report the pod ready", ready(corev1.ConditionTrue))

	lost := time.Now()
	w.stopKubelet()
	testenv.EventuallyEvery(t, time.Second, 3*time.Minute, "the node controller to mark the pod not ready", ready(corev1.ConditionFalse))
	t.Logf("the node stopped reporting: the pod not ready after %s", time.Since(lost).Round(time.Second))
	silent := time.Now()
	restore := testenv.SilenceAddress(t, pod.Status.PodIP)

	second := w.WaitForTask(id, 5*time.Minute, "attempt 2", func(task etlcontext.Task) bool { return task.Attempt == 2 })
	t.Logf("attempt 2 launched %s after the pod fell silent", time.Since(silent).Round(time.Second))
	if *second.RunID == *first.RunID {
		t.Error("the retry runs under the first attempt's run")
	}
	var reason string
	if err := w.Pool.QueryRow(ctx, `SELECT payload->>'reason' FROM data_manager.event_store WHERE etl_context_id = $1 AND type = 'sleeper:ERROR'`, id).Scan(&reason); err != nil {
		t.Fatal(err)
	}
	if want := "its node " + pod.Spec.NodeName + " stopped reporting to Kubernetes"; !strings.Contains(reason, want) {
		t.Errorf("attempt 1 ended: %q, want %q", reason, want)
	} else {
		t.Logf("attempt 1 ended: %s", reason)
	}

	// The node comes back: the first pod's task process, cut off, stopped
	// its command; it finds its run superseded and ends.
	restore()
	w.startKubelet()
	w.WaitForTask(id, 3*time.Minute, "running attempt 2 in its pod", func(task etlcontext.Task) bool {
		return task.Status == etlcontext.StatusRunning && task.InitialEventLocked && task.PID != nil && task.Attempt == 2
	})
	testenv.Eventually(t, 2*time.Minute, "the first pod to end", func() (bool, error) {
		p, err := w.core.Pods(w.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, fmt.Errorf("phase %s", p.Status.Phase)
	})
	out, _ := w.kubectl("logs", pod.Name, "--tail=8")
	t.Logf("the first pod's last lines:\n%s", out)
	if res := w.Dama(w.cfg, "cancel", strconv.FormatInt(id, 10)); res.Code != 0 {
		t.Fatalf("cancel: %d %s", res.Code, res.Stderr)
	}
	w.WaitForTask(id, 2*time.Minute, "CANCELLED", func(task etlcontext.Task) bool { return task.Status == etlcontext.StatusCancelled })
}

// stopKubelet kills the node's kubelet (scripts/kube.sh's) with SIGKILL:
// its containers run on, unwatched. It is started again when the test
// ends.
func (w *kubeWorld) stopKubelet() {
	w.T.Helper()
	dir := cmp.Or(os.Getenv("DAMA_KUBE_DIR"), "/tmp/dama-kube")
	b, err := os.ReadFile(filepath.Join(dir, "run", "kubelet.pid"))
	if err != nil {
		w.T.Fatalf("the kubelet's pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 1 {
		w.T.Fatalf("the kubelet's pid %q: %v", b, err)
	}
	w.T.Cleanup(w.startKubelet)
	// Its process group: scripts/kube.sh starts it with setsid.
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil {
		w.T.Fatalf("kill the kubelet: %v", err)
	}
}

// startKubelet starts the node's kubelet if it is not running, and waits
// for the node to be Ready.
func (w *kubeWorld) startKubelet() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "bash", "../scripts/kube.sh", "node").CombinedOutput(); err != nil {
		w.T.Errorf("start the kubelet again: %v\n%s", err, out)
	}
}
