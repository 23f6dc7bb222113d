package kubernetes

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	fakecorev1 "k8s.io/client-go/kubernetes/typed/core/v1/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/supervisor"
)

// fakeCore is client-go's fake of the core API, over an object tracker:
// what the runner writes, it reads back.
func fakeCore(t *testing.T) *fakecorev1.FakeCoreV1 {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	tracker := k8stesting.NewObjectTracker(scheme, serializer.NewCodecFactory(scheme).UniversalDecoder())
	core := &fakecorev1.FakeCoreV1{Fake: &k8stesting.Fake{}}
	core.AddReactor("*", "*", k8stesting.ObjectReaction(tracker))
	return core
}

const testConfig = `
log_dir: /var/log/dama
kill_grace: 20s
kubernetes: {image: "registry.example/dama:1.0", namespace: etl}
kinds:
  load:
    command: [python, -m, etl.load]
    runner: kubernetes
    lock_mode: advisory
    pod_retention: 1h
    pod:
      metadata: {labels: {team: data}}
      spec:
        serviceAccountName: loader
        nodeSelector: {pool: etl}
        tolerations: [{key: etl, operator: Exists}]
        volumes: [{name: scratch, emptyDir: {}}]
        containers:
          - name: task
            image: python:3.12
            resources: {limits: {memory: 2Gi, cpu: 1}}
            envFrom: [{secretRef: {name: warehouse}}]
            volumeMounts: [{name: scratch, mountPath: /scratch}]
  local:
    command: [/bin/true]
`

func newTestRunner(t *testing.T, yaml string) (*Launcher, *fakecorev1.FakeCoreV1) {
	t.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	core := fakeCore(t)
	r, err := NewWith(core, cfg.Kubernetes.Namespace, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	return r, core
}

func TestALaunchIsAPodWithDamasContainersAndASecretItOwns(t *testing.T) {
	r, core := newTestRunner(t, testConfig)
	ctx := context.Background()
	l := launch{ContextID: 42, RunID: "7f3c9a12-0b1e-4c55-9d0e-2a6f1e8b4c01", Kind: "load", Secrets: []byte("s\x00"), Config: []byte("log_dir: /l")}
	if err := r.create(ctx, l); err != nil {
		t.Fatal(err)
	}
	// A run is launched once: again, it is refused, and its pod stays.
	if err := r.create(ctx, l); !apierrors.IsAlreadyExists(errors.Unwrap(err)) {
		t.Fatalf("a launch made again: %v", err)
	}
	pod, err := core.Pods("etl").Get(ctx, "dama-42-7f3c9a120b1e", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Labels[LabelTask] != "42" || pod.Labels[LabelRun] != l.RunID || pod.Labels[LabelKind] != "load" || pod.Labels["team"] != "data" || pod.Labels[LabelManagedBy] != "dama" {
		t.Errorf("labels %v", pod.Labels)
	}
	if len(pod.OwnerReferences) != 0 {
		t.Errorf("the pod has owners %v: a supervisor's redeploy would take it", pod.OwnerReferences)
	}
	if pod.Annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] != "false" || pod.Annotations["kubectl.kubernetes.io/default-container"] != "dama" {
		t.Errorf("annotations %v", pod.Annotations)
	}
	spec := pod.Spec
	if spec.RestartPolicy != corev1.RestartPolicyNever || *spec.TerminationGracePeriodSeconds != 50 || spec.ServiceAccountName != "loader" || spec.NodeSelector["pool"] != "etl" || len(spec.Tolerations) != 1 {
		t.Errorf("spec: restart %s, grace %d, account %q, selector %v", spec.RestartPolicy, *spec.TerminationGracePeriodSeconds, spec.ServiceAccountName, spec.NodeSelector)
	}
	names := func(cs []corev1.Container) []string {
		var n []string
		for _, c := range cs {
			n = append(n, c.Name)
		}
		return n
	}
	if got := names(spec.InitContainers); !slices.Equal(got, []string{"dama-shim"}) {
		t.Errorf("init containers %v", got)
	}
	if got := names(spec.Containers); !slices.Equal(got, []string{"dama", "task"}) {
		t.Fatalf("containers %v", got)
	}
	dama, task := spec.Containers[0], spec.Containers[1]
	n := len(dama.Command)
	launch, err := protocol.ParseLaunch(dama.Command[2 : n-2])
	if err != nil || dama.Command[0] != "/dama-taskrunner" || dama.Command[1] != protocol.Subcommand ||
		!slices.Equal(dama.Command[n-2:], []string{"--shim-socket", "/dama-run/shim.sock"}) {
		t.Fatalf("dama's command %q: %v", dama.Command, err)
	}
	if launch.SecretsDigest != protocol.PodDigest(l.Secrets, l.Config) {
		t.Errorf("dama's launch names the digest %q, not its Secret's", launch.SecretsDigest)
	}
	if launch.ContextID != 42 || launch.RunID != l.RunID || launch.LockMode != config.LockModeAdvisory || launch.LogDir != "/var/log/dama" {
		t.Errorf("dama's launch %+v", launch)
	}
	if dama.Image != "registry.example/dama:1.0" || *dama.SecurityContext.RunAsNonRoot != true || *dama.SecurityContext.AllowPrivilegeEscalation || dama.SecurityContext.Capabilities.Drop[0] != "ALL" {
		t.Errorf("dama's container %s, %+v", dama.Image, dama.SecurityContext)
	}
	if !slices.Equal(task.Command, []string{"/dama-run/dama-shim", "/dama-run/shim.sock"}) || task.Image != "python:3.12" || task.Resources.Limits.Memory().String() != "2Gi" || len(task.EnvFrom) != 1 {
		t.Errorf("the task's container: %q %s %v", task.Command, task.Image, task.Resources.Limits)
	}
	if caps := task.SecurityContext.Capabilities; caps == nil || !slices.Contains(caps.Drop, "NET_RAW") {
		t.Errorf("the task's container keeps raw sockets on the task process's network: %+v", task.SecurityContext)
	}
	if e := task.SecurityContext.AllowPrivilegeEscalation; e == nil || *e {
		t.Errorf("the task's container lets a setuid program escape the shim's kill: %+v", task.SecurityContext)
	}
	// Only dama's container mounts the Secret.
	for _, c := range spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == volumeSecrets && c.Name != "dama" {
				t.Errorf("container %s mounts the Secret", c.Name)
			}
		}
	}
	secret, err := core.Secrets("etl").Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["secrets"]) != "s\x00" || string(secret.Data["dama.yaml"]) != "log_dir: /l" || len(secret.OwnerReferences) != 1 || secret.OwnerReferences[0].Name != pod.Name || !*secret.Immutable {
		t.Errorf("secret %+v", secret)
	}
}

func TestAPodsStateSaysWhyItWaitsOrEnded(t *testing.T) {
	r, core := newTestRunner(t, testConfig)
	ctx := context.Background()
	runID := "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	if st, err := r.Pod(ctx, 7, runID); err != nil || st.Exists {
		t.Fatalf("before its launch: %+v, %v", st, err)
	}
	if err := r.create(ctx, launch{ContextID: 7, RunID: runID, Kind: "load"}); err != nil {
		t.Fatal(err)
	}
	pods := core.Pods("etl")
	silentSince := metav1.NewTime(time.Date(2026, 11, 29, 6, 1, 2, 0, time.FixedZone("CET", 3600)))
	set := func(status corev1.PodStatus) {
		t.Helper()
		pod, err := pods.Get(ctx, PodName(7, runID), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Spec.NodeName = "n1"
		pod.Status = status
		if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name          string
		status        corev1.PodStatus
		reason        string
		started, over bool
	}{
		{"unschedulable", corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable", Message: "0/1 nodes are available"}}}, "Unschedulable: 0/1 nodes are available", false, false},
		{"image", corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "task", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "pull python:3.99"}}},
		}}, "container task ImagePullBackOff: pull python:3.99", true, false},
		{"oom", corev1.PodStatus{Phase: corev1.PodFailed, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 102}}},
			{Name: "task", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "OOMKilled", ExitCode: 137}}},
		}}, "container task OOMKilled (exit code 137)", true, true},
		{"evicted", corev1.PodStatus{Phase: corev1.PodFailed, Reason: "Evicted", Message: "The node was low on resource: memory.", ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 102}}},
			{Name: "task", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Error", ExitCode: 143}}},
		}}, "Evicted: The node was low on resource: memory.", true, true},
		// The pod garbage collector's Failed, for a node that was
		// deleted: its containers may run on.
		{"node deleted", corev1.PodStatus{Phase: corev1.PodFailed, Conditions: []corev1.PodCondition{{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByPodGC"}}, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "task", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}}, "DeletionByPodGC", true, false},
		// The kubelet's last word, and the node controller's: a node
		// that stopped reporting, and then the taint manager's deletion.
		{"node silent", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: silentSince}}, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "task", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}}, "its node n1 stopped reporting to Kubernetes (the pod not ready since 2026-11-29T05:01:02Z)", true, false},
		{"node lost", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionFalse, LastTransitionTime: silentSince},
			{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "DeletionByTaintManager", Message: "Taint manager: deleting due to NoExecute taint"},
		}, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "task", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}}, "its node n1 stopped reporting to Kubernetes (the pod not ready since 2026-11-29T05:01:02Z); DeletionByTaintManager: Taint manager: deleting due to NoExecute taint", true, false},
		// The kubelet's own: a container that is not running yet.
		{"not ready", corev1.PodStatus{Phase: corev1.PodRunning, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse, Reason: "ContainersNotReady"}}, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
			{Name: "task", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
		}}, "", true, false},
	} {
		set(c.status)
		st, err := r.Pod(ctx, 7, runID)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Exists || st.Reason != c.reason || st.Started != c.started || st.Over != c.over {
			t.Errorf("%s: %+v, want reason %q, started %t, over %t", c.name, st, c.reason, c.started, c.over)
		}
	}
	if err := r.Delete(ctx, 7, runID); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, 7, runID); err != nil {
		t.Errorf("deleting a pod that is gone: %v", err)
	}
	if st, _ := r.Pod(ctx, 7, runID); st.Exists {
		t.Error("the pod is still there once deleted")
	}
}

func TestPruneDeletesThePodsPastTheirRetention(t *testing.T) {
	r, core := newTestRunner(t, testConfig)
	ctx := context.Background()
	terminated := func(ended time.Duration) []corev1.ContainerStatus {
		at := metav1.NewTime(time.Now().Add(-ended))
		return []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: at}}},
			{Name: "task", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: at}}},
		}
	}
	for i, status := range []corev1.PodStatus{
		// Ended 2h ago, past the kind's 1h: deleted.
		{Phase: corev1.PodSucceeded, ContainerStatuses: terminated(2 * time.Hour)},
		// Ended 10m ago: kept.
		{Phase: corev1.PodFailed, ContainerStatuses: terminated(10 * time.Minute)},
		// Running: kept.
		{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{Name: "dama", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		// Created long ago (the fake sets no creation time) and never
		// started: a launch taken back left it; deleted.
		{Phase: corev1.PodPending},
		// Its task process ended 2h ago, a sidecar runs on: deleted.
		{Phase: corev1.PodRunning, ContainerStatuses: append(terminated(2*time.Hour), corev1.ContainerStatus{Name: "proxy", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}})},
		// Its task process found its task finished (cancelled while the
		// pod started) a minute ago: it ran nothing; deleted.
		{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: "dama", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: protocol.ExitFinished, FinishedAt: metav1.NewTime(time.Now().Add(-time.Minute))}}},
			{Name: "task", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}},
		}},
	} {
		runID := strings.Repeat(string(rune('a'+i)), 12)
		if err := r.create(ctx, launch{ContextID: int64(i + 1), RunID: runID, Kind: "load"}); err != nil {
			t.Fatal(err)
		}
		pod, _ := core.Pods("etl").Get(ctx, PodName(int64(i+1), runID), metav1.GetOptions{})
		pod.Status = status
		if _, err := core.Pods("etl").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	list, err := core.Pods("etl").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, p := range list.Items {
		left = append(left, p.Name)
	}
	if !slices.Equal(left, []string{"dama-2-bbbbbbbbbbbb", "dama-3-cccccccccccc"}) {
		t.Errorf("pods left %v", left)
	}
}

func TestATemplateThatWouldBreakOrExposeThePodIsRefused(t *testing.T) {
	for name, c := range map[string]struct{ spec, want string }{
		"no task container":      {`{containers: [{name: main, image: x}]}`, "container named task"},
		"its own command":        {`{containers: [{name: task, image: x, command: [run]}]}`, "kind's command"},
		"shared processes":       {`{shareProcessNamespace: true, containers: [{name: task, image: x}]}`, "shareProcessNamespace"},
		"host processes":         {`{hostPID: true, containers: [{name: task, image: x}]}`, "hostPID"},
		"restarts":               {`{restartPolicy: OnFailure, containers: [{name: task, image: x}]}`, "restartPolicy"},
		"dama's container":       {`{containers: [{name: task, image: x}, {name: dama, image: y}]}`, "dama's"},
		"dama's volume":          {`{volumes: [{name: dama-secrets, emptyDir: {}}], containers: [{name: task, image: x}]}`, "dama's"},
		"over the shim":          {`{volumes: [{name: v, emptyDir: {}}], containers: [{name: task, image: x, volumeMounts: [{name: v, mountPath: /dama-run}]}]}`, "dama's"},
		"a misspelt field":       {`{containers: [{name: task, image: x, imagePullPolicyy: Always}]}`, "unknown field"},
		"a wrong-typed field":    {`{containers: [{name: task, image: [x]}]}`, "PodTemplateSpec"},
		"mounts the Secret":      {`{containers: [{name: task, image: x, volumeMounts: [{name: dama-secrets, mountPath: /s}]}]}`, "dama's"},
		"a sidecar on /dama-run": {`{containers: [{name: task, image: x}, {name: side, image: y, volumeMounts: [{name: dama-run, mountPath: /r}]}]}`, "dama's"},
		"an init on the shim":    {`{initContainers: [{name: i, image: y, volumeMounts: [{name: dama-run, mountPath: /r}]}], containers: [{name: task, image: x}]}`, "dama's"},
		"a hook":                 {`{containers: [{name: task, image: x, lifecycle: {postStart: {exec: {command: [sh]}}}}]}`, "hooks and probes"},
		"a probe":                {`{containers: [{name: task, image: x, livenessProbe: {exec: {command: [sh]}}}]}`, "hooks and probes"},
		"the node's files":       {`{volumes: [{name: n, hostPath: {path: /var/lib/kubelet}}], containers: [{name: task, image: x}]}`, "hostPath"},
		"privileged":             {`{containers: [{name: task, image: x, securityContext: {privileged: true}}]}`, "privileged"},
		"ptrace":                 {`{containers: [{name: task, image: x, securityContext: {capabilities: {add: [SYS_PTRACE]}}}]}`, "SYS_PTRACE"},
		"the node's network":     {`{hostNetwork: true, containers: [{name: task, image: x}]}`, "hostNetwork"},
		"unconfined seccomp":     {`{securityContext: {seccompProfile: {type: Unconfined}}, containers: [{name: task, image: x}]}`, "seccompProfile"},
		"a host port":            {`{containers: [{name: task, image: x, ports: [{containerPort: 80, hostPort: 80}]}]}`, "hostPort"},
		"an unsafe sysctl":       {`{securityContext: {sysctls: [{name: kernel.shm_rmid_forced, value: "0"}, {name: net.core.somaxconn, value: "1024"}]}, containers: [{name: task, image: x}]}`, "sysctls"},
		"over the shim, oddly":   {`{volumes: [{name: v, emptyDir: {}}], containers: [{name: task, image: x, volumeMounts: [{name: v, mountPath: "//dama-run/./dama-shim"}]}]}`, "dama's"},
	} {
		cfg := "log_dir: /l\nkubernetes: {image: d}\nkinds:\n  k: {command: [x], runner: kubernetes, pod: {spec: " + c.spec + "}}\n"
		parsed, err := config.Parse([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, err = NewWith(fakeCore(t), "default", parsed, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "kind k: pod: ") {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	for name, c := range map[string]struct{ metadata, want string }{
		"a label of dama's": {`{labels: {dama.dev/run: x}}`, "label dama.dev/run is dama's"},
		"an owner":          {`{ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: r, uid: u}]}`, "no owner"},
		"a finalizer":       {`{finalizers: [example.com/keep]}`, "never left stuck"},
		"a name":            {`{name: mine}`, "name and namespace are dama's"},
	} {
		cfg := "log_dir: /l\nkubernetes: {image: d}\nkinds:\n  k: {command: [x], runner: kubernetes, pod: {metadata: " + c.metadata + ", spec: {containers: [{name: task, image: x}]}}}\n"
		parsed, err := config.Parse([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := NewWith(fakeCore(t), "default", parsed, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, c.want)
		}
	}
	cfg := "log_dir: /l\nkubernetes: {image: d}\nkinds:\n  k_: {command: [x], runner: kubernetes, pod: {spec: {containers: [{name: task, image: x}]}}}\n"
	if parsed, err := config.Parse([]byte(cfg)); err != nil {
		t.Errorf("a kind named k_: %v", err)
	} else if _, err := NewWith(fakeCore(t), "default", parsed, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil || !strings.Contains(err.Error(), "labels its pods") {
		t.Errorf("a kind whose name is no label value: %v", err)
	}
}

// launchedPod is the pod a runner of the configuration yaml creates for a
// launch of its kind load.
func launchedPod(t *testing.T, yaml string) *corev1.Pod {
	t.Helper()
	r, core := newTestRunner(t, yaml)
	ctx := context.Background()
	const runID = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
	if err := r.create(ctx, launch{ContextID: 7, RunID: runID, Kind: "load"}); err != nil {
		t.Fatal(err)
	}
	pod, err := core.Pods("etl").Get(ctx, PodName(7, runID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod
}

func TestDamasContainersTakeTheConfiguredResources(t *testing.T) {
	pod := launchedPod(t, strings.Replace(testConfig, "namespace: etl}", "namespace: etl, resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {cpu: 1, memory: 128Mi}}}", 1))
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		res := c.Resources
		switch c.Name {
		case containerDama, containerShim:
			if res.Requests.Cpu().String() != "50m" || res.Requests.Memory().String() != "64Mi" || res.Limits.Cpu().String() != "1" || res.Limits.Memory().String() != "128Mi" {
				t.Errorf("container %s: %v", c.Name, res)
			}
		case containerTask:
			if res.Limits.Memory().String() != "2Gi" || len(res.Requests) > 0 {
				t.Errorf("the task's container has its own resources: %v", res)
			}
		}
	}
	for name, c := range map[string]struct{ resources, want string }{
		"over its limit":   {"{requests: {memory: 1Gi}, limits: {memory: 128Mi}}", "memory: the request 1Gi is over the limit 128Mi"},
		"a misspelt field": {"{limit: {memory: 128Mi}}", "unknown field"},
		"not a quantity":   {"{limits: {memory: lots}}", "ResourceRequirements"},
		"a claim":          {"{claims: [{name: gpu}]}", "claim no device"},
	} {
		cfg, err := config.Parse([]byte(strings.Replace(testConfig, "namespace: etl}", "namespace: etl, resources: "+c.resources+"}", 1)))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, err = NewWith(fakeCore(t), "etl", cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "kubernetes.resources: ") {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
	}
}

// dama's image is named once: by kubernetes.image, else by $DAMA_IMAGE,
// which deploy/kubernetes sets to the supervisor's own; a supervisor with
// neither refuses its kubernetes kinds. A task's container that names no
// image runs dama's.
func TestDamasImageIsTheConfiguredOrTheSupervisorsOwn(t *testing.T) {
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: etl}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kubeconfig)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	noImage := strings.Replace(testConfig, `image: "registry.example/dama:1.0", `, "", 1)
	for _, c := range []struct{ name, config, env, want string }{
		{"configured", testConfig, "registry.example/dama:2.0", "registry.example/dama:1.0"},
		{"the supervisor's", noImage, "registry.example/dama:2.0", "registry.example/dama:2.0"},
		{"none", noImage, "", ""},
	} {
		t.Setenv(ImageEnv, c.env)
		// Without the image, the configuration is one for any command but
		// a supervisor's (dama submit, a pod's task process).
		cfg, err := config.Parse([]byte(c.config))
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(cfg, logger)
		if cfg.Kubernetes.Image == c.env && c.env != "" {
			t.Errorf("%s: New changed the configuration's image", c.name)
		}
		switch {
		case c.want == "" && (err == nil || err.Error() != "kind load runs on kubernetes: kubernetes.image (or $DAMA_IMAGE), dama's image for its pods, is required"):
			t.Errorf("%s: %v, want the image asked for", c.name, err)
		case c.want != "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && r.image != c.want:
			t.Errorf("%s: image %q, want %q", c.name, r.image, c.want)
		}
	}
	pod := launchedPod(t, strings.Replace(testConfig, "image: python:3.12", "", 1))
	for _, c := range pod.Spec.Containers {
		if c.Image != "registry.example/dama:1.0" {
			t.Errorf("container %s runs %q, want dama's image", c.Name, c.Image)
		}
	}
}

func TestALaunchWhoseSecretSomeoneElseMadeDoesNotRun(t *testing.T) {
	r, core := newTestRunner(t, testConfig)
	ctx := context.Background()
	l := launch{ContextID: 42, RunID: "7f3c9a12-0b1e-4c55-9d0e-2a6f1e8b4c01", Kind: "load"}
	planted := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: PodName(l.ContextID, l.RunID), Namespace: "etl"}, Data: map[string][]byte{"dama.yaml": []byte("kinds: {load: {command: [steal]}}")}}
	if _, err := core.Secrets("etl").Create(ctx, planted, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := r.create(ctx, l); err == nil || !strings.Contains(err.Error(), "create the Secret") {
		t.Fatalf("launch: %v, want the Secret refused", err)
	}
	if _, err := core.Pods("etl").Get(ctx, planted.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod of a planted Secret is still there: %v", err)
	}
}

func TestOnlyDamasContainerMountsTheTLSSecret(t *testing.T) {
	pod := launchedPod(t, strings.Replace(testConfig, "namespace: etl}", "namespace: etl, tls_secret: db-ca}", 1))
	if i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == volumeTLS }); i < 0 || pod.Spec.Volumes[i].Secret == nil || pod.Spec.Volumes[i].Secret.SecretName != "db-ca" {
		t.Fatalf("volumes %+v", pod.Spec.Volumes)
	}
	for _, c := range append(pod.Spec.InitContainers, pod.Spec.Containers...) {
		mounted := slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
			return m.Name == volumeTLS && m.MountPath == "/var/run/dama/tls" && m.ReadOnly
		})
		if mounted != (c.Name == containerDama) {
			t.Errorf("container %s mounts the TLS Secret: %t", c.Name, mounted)
		}
	}
}

// A sidecar shares the pod's network with the task process, as the
// command does: one that keeps the runtime's NET_RAW is warned of at the
// start, once per container; one that drops it is not. (One that adds it
// leaves the Baseline standard, and is refused.)
func TestASidecarKeepingNetRawIsWarnedOf(t *testing.T) {
	cfg := "log_dir: /l\nkubernetes: {image: d}\nkinds:\n  k: {command: [x], runner: kubernetes, pod: {spec: " +
		`{initContainers: [{name: fetch, image: y}], containers: [{name: task, image: x},` +
		` {name: proxy, image: y, securityContext: {capabilities: {drop: [CHOWN]}}},` +
		` {name: quiet, image: y, securityContext: {capabilities: {drop: [NET_RAW]}}},` +
		` {name: none, image: y, securityContext: {capabilities: {drop: [all]}}}]}` + "}}\n"
	parsed, err := config.Parse([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	if _, err := NewWith(fakeCore(t), "default", parsed, slog.New(slog.NewTextHandler(&log, nil))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"fetch", "proxy"} {
		if n := strings.Count(log.String(), "container="+c+"\n"); n != 1 {
			t.Errorf("container %s warned of %d times, want once:\n%s", c, n, log.String())
		}
	}
	for _, c := range []string{"task", "quiet", "none"} {
		if strings.Contains(log.String(), "container="+c+"\n") {
			t.Errorf("container %s warned of, want not:\n%s", c, log.String())
		}
	}
}

// A pod's task process is given what it needs of its supervisor's
// secrets and not the host's lock keeper's, which would let a pod's
// process speak for the tasks of the supervisor's host.
func TestAPodIsGivenNoSecretOfTheHostsLockKeeper(t *testing.T) {
	r, core := newTestRunner(t, testConfig)
	ctx := context.Background()
	r.configPath = filepath.Join(t.TempDir(), "dama.yaml")
	if err := os.WriteFile(r.configPath, []byte(testConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	runID := "7f3c9a12-0b1e-4c55-9d0e-2a6f1e8b4c01"
	given := protocol.Secrets{Env: []string{"DATABASE_URL=postgres://x"}, RunKey: "run-key", Keeper: []byte("the keeper's")}
	outcome, err := r.Launch(ctx, supervisor.Launch{
		Task: &etlcontext.Context{ID: 42, Kind: "load"}, Run: etlcontext.Run{ID: runID},
		Secrets: given, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil || outcome != supervisor.LaunchPending {
		t.Fatalf("launch: %v, %v", outcome, err)
	}
	if given.Keeper == nil {
		t.Error("the caller's secrets were changed")
	}
	secret, err := core.Secrets("etl").Get(ctx, PodName(42, runID), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, b := range secret.Data {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, _, err := protocol.ReadPodFiles(filepath.Join(dir, secretsKey), filepath.Join(dir, configKey), protocol.PodDigest(secret.Data[secretsKey], secret.Data[configKey]))
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Keeper) != 0 || got.RunKey != "run-key" || !slices.Equal(got.Env, given.Env) {
		t.Errorf("the pod's secrets: a keeper's of %d bytes, run key %q, %d variables; want the run key and the database's, and no keeper's", len(got.Keeper), got.RunKey, len(got.Env))
	}
}
