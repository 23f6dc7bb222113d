//go:build kubernetes

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
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dama-etl/dama/internal/etlcontext"
	"github.com/dama-etl/dama/internal/podrunner"
	"github.com/dama-etl/dama/internal/testenv"
)

// The tests on a real cluster: scripts/test-kubernetes.sh starts one
// (scripts/kube.sh), with the test server on the node's address, and
// runs them with go test -tags kubernetes. Elsewhere they are skipped.
const (
	// kubeDBAddrEnv is where the pods reach the test server (host:port);
	// kubeDBPasswordEnv, its postgres role's password.
	kubeDBAddrEnv     = "DAMA_TEST_KUBE_DB_ADDR"
	kubeDBPasswordEnv = "DAMA_TEST_KUBE_DB_PASSWORD"
)

type kubeWorld struct {
	*testenv.Env
	ns   string
	core corev1client.CoreV1Interface
	// cfg is the configuration on this host (dama submit, logs); the
	// supervisor's pod has the same in its ConfigMap.
	cfg string
}

const kubeConfig = `
log_dir: /var/log/dama
poll_interval: 1s
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
	w := &kubeWorld{Env: env, core: core, ns: "dama-e2e-" + strconv.FormatInt(time.Now().UnixNano()%1e9, 36)}
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
// with the world's configuration.
func (w *kubeWorld) deploy() {
	w.T.Helper()
	dir := filepath.Join(w.Dir, "overlay")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		w.T.Fatal(err)
	}
	base, err := filepath.Abs("../../deploy/kubernetes")
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
	if out, err := w.kubectl("apply", "-k", dir); err != nil {
		w.T.Fatalf("kubectl apply -k: %v\n%s", err, out)
	}
	w.rolledOut()
}

// rolledOut waits for the supervisor's Deployment to be rolled out.
func (w *kubeWorld) rolledOut() {
	w.T.Helper()
	if out, err := w.kubectl("rollout", "status", "deployment/dama-supervisor", "--timeout=150s"); err != nil {
		w.T.Fatalf("rollout status: %v\n%s", err, out)
	}
}

// taskPods returns the names of task id's pods.
func (w *kubeWorld) taskPods(id int64) []string {
	w.T.Helper()
	list, err := w.core.Pods(w.ns).List(context.Background(), metav1.ListOptions{LabelSelector: podrunner.LabelTask + "=" + strconv.FormatInt(id, 10)})
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
	for i := range 3 {
		began := time.Now()
		if out, err := w.kubectl("rollout", "restart", "deployment/dama-supervisor"); err != nil {
			t.Fatalf("rollout restart: %v\n%s", err, out)
		}
		w.rolledOut()
		t.Logf("roll %d: rolled out in %s", i+1, time.Since(began).Round(time.Millisecond))
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
