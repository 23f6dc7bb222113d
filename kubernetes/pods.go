// Package kubernetes runs the tasks of kubernetes kinds (config.RunnerKubernetes)
// in pods, with client-go: one bare pod per attempt, made from the kind's
// template, with no owner (a supervisor's redeploy leaves it running), and
// a Secret beside it that only dama's container mounts (see
// docs/kubernetes.md). The task process in the pod holds the task's lock
// as on a host, and the supervisors adopt it through that lock: the pod
// is only where it lives.
package kubernetes

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/kubernetes/shim"
	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/supervisor"
)

// Labels of a task's pod and Secret.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	LabelTask      = "dama.dev/task"
	LabelRun       = "dama.dev/run"
	LabelKind      = "dama.dev/kind"
	managedBy      = "dama"
)

// ImageEnv names dama's image for the task pods when kubernetes.image
// names none: deploy/kubernetes sets it to the supervisor's own image, so
// that its kustomization's images: names it once for both.
const ImageEnv = "DAMA_IMAGE"

// What dama adds to a kind's template; a template may use none of these
// names.
const (
	containerTask  = "task"
	containerDama  = "dama"
	containerShim  = "dama-shim"
	volumeRun      = "dama-run"
	volumeSecrets  = "dama-secrets"
	volumeLogs     = "dama-logs"
	volumeTLS      = "dama-tls"
	tlsDir         = "/var/run/dama/tls"
	runDir         = "/dama-run"
	secretsDir     = "/var/run/dama/secrets"
	secretsKey     = "secrets"
	configKey      = "dama.yaml"
	shimName       = "dama-shim"
	shimSocket     = runDir + "/" + shim.Socket
	taskRunnerPath = "/dama-taskrunner"
	// logDir is where a pod's task process keeps the task's log file
	// (protocol.Launch.LogDir), a volume of dama's container alone,
	// whatever the configuration's log_dir, which is its supervisor's
	// host's.
	logDir = "/var/log/dama"
	// imageUser is the image's user (scripts/image.sh), which owns nothing.
	imageUser = 65532
)

// Launcher creates, reads and deletes the pods of one configuration's
// kubernetes kinds in one namespace.
type Launcher struct {
	core      corev1client.CoreV1Interface
	namespace string
	// configPath is the configuration's file, which each pod is given.
	configPath string
	image      string
	tlsSecret  string
	resources  corev1.ResourceRequirements
	kinds      map[string]kind
	logger     *slog.Logger
}

// kind is what a kubernetes kind's pods are made from.
type kind struct {
	template     corev1.PodTemplateSpec
	lockMode     config.LockMode
	killGrace    time.Duration
	retention    time.Duration
	startTimeout time.Duration
}

var _ supervisor.Launcher = (*Launcher)(nil)

// New returns the Launcher of cfg's kubernetes kinds, talking to the cluster
// the process runs in (its service account), or else the one $KUBECONFIG
// (or ~/.kube/config) names; their pods run dama's image of
// kubernetes.image, else of $DAMA_IMAGE.
func New(cfg *config.Config, logger *slog.Logger) (*Launcher, error) {
	withImage := *cfg
	withImage.Kubernetes.Image = cmp.Or(cfg.Kubernetes.Image, os.Getenv(ImageEnv))
	cfg = &withImage
	rc, namespace, err := clusterConfig()
	if err != nil {
		return nil, err
	}
	// client-go's default, 5 requests a second, would make a burst of
	// launches wait on the client.
	rc.QPS, rc.Burst = 50, 100
	// A step waits for the API while it holds the task's lock.
	rc.Timeout = 10 * time.Second
	core, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return NewWith(core, cmp.Or(cfg.Kubernetes.Namespace, namespace), cfg, logger)
}

// clusterConfig is how to reach the cluster, and the namespace the
// process's own pod or kubeconfig context is in.
func clusterConfig() (*rest.Config, string, error) {
	rc, err := rest.InClusterConfig()
	if err == nil {
		ns, _ := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		return rc, cmp.Or(strings.TrimSpace(string(ns)), metav1.NamespaceDefault), nil
	}
	if !errors.Is(err, rest.ErrNotInCluster) {
		return nil, "", fmt.Errorf("kubernetes: %w", err)
	}
	loader := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), &clientcmd.ConfigOverrides{})
	rc, err = loader.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: not in a cluster, and no kubeconfig: %w", err)
	}
	ns, _, err := loader.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("kubernetes: the kubeconfig's namespace: %w", err)
	}
	return rc, ns, nil
}

// NewWith returns the Launcher of cfg's kubernetes kinds, whose pods core
// creates in namespace. It checks each kind's template.
func NewWith(core corev1client.CoreV1Interface, namespace string, cfg *config.Config, logger *slog.Logger) (*Launcher, error) {
	cfg = cfg.WithDefaults()
	r := &Launcher{core: core, namespace: namespace, configPath: cfg.Path, image: cfg.Kubernetes.Image, tlsSecret: cfg.Kubernetes.TLSSecret, resources: damaResources(), kinds: map[string]kind{}, logger: logger}
	if len(cfg.Kubernetes.Resources) > 0 {
		var err error
		if r.resources, err = parseResources(cfg.Kubernetes.Resources); err != nil {
			return nil, fmt.Errorf("kubernetes.resources: %w", err)
		}
	}
	for _, name := range cfg.KindNames() {
		k := cfg.Kinds[name]
		if k.Runner != config.RunnerKubernetes {
			continue
		}
		if r.image == "" {
			return nil, fmt.Errorf("kind %s runs on kubernetes: kubernetes.image (or $%s), dama's image for its pods, is required", name, ImageEnv)
		}
		if errs := validation.IsValidLabelValue(name); len(errs) > 0 {
			return nil, fmt.Errorf("kind %s runs on kubernetes: its name labels its pods: %s", name, strings.Join(errs, "; "))
		}
		t, err := parseTemplate(k.Pod)
		if err != nil {
			return nil, fmt.Errorf("kind %s: pod: %w", name, err)
		}
		for _, c := range keepNetRaw(t.Spec) {
			logger.Warn("a container of a kind's pod template keeps NET_RAW, with which it could read and forge the task process's packets to the database in the pod's network: drop it (securityContext.capabilities.drop: [NET_RAW])", "kind", name, "container", c)
		}
		r.kinds[name] = kind{template: t, lockMode: k.LockMode, killGrace: time.Duration(*k.KillGrace), retention: time.Duration(*k.PodRetention), startTimeout: time.Duration(k.StartTimeout)}
	}
	return r, nil
}

// strict decodes the JSON raw into v, refusing a field v does not have:
// a misspelt one is an error, not a setting silently ignored.
func strict(raw []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// parseTemplate reads a kind's pod template, and says what in it would
// keep dama's part of the pod from working or from being safe.
func parseTemplate(raw []byte) (corev1.PodTemplateSpec, error) {
	var t corev1.PodTemplateSpec
	if err := strict(raw, &t); err != nil {
		return t, fmt.Errorf("not a PodTemplateSpec (metadata, spec): %w", err)
	}
	spec := &t.Spec
	var task *corev1.Container
	for i, c := range spec.Containers {
		switch c.Name {
		case containerTask:
			task = &spec.Containers[i]
		case containerDama, containerShim:
			return t, fmt.Errorf("container name %s is dama's", c.Name)
		}
	}
	for _, c := range spec.InitContainers {
		if c.Name == containerDama || c.Name == containerShim {
			return t, fmt.Errorf("init container name %s is dama's", c.Name)
		}
	}
	switch {
	case task == nil:
		return t, errors.New("want a container named task, which runs the kind's command")
	case len(task.Command) > 0 || len(task.Args) > 0:
		return t, errors.New("containers.task: command and args are the kind's command, not the container's")
	case spec.ShareProcessNamespace != nil && *spec.ShareProcessNamespace:
		// The command would see dama's container's processes, and
		// through /proc their files: the secrets.
		return t, errors.New("shareProcessNamespace would let the command reach the task process and its secrets")
	case spec.RestartPolicy != "" && spec.RestartPolicy != corev1.RestartPolicyNever:
		return t, fmt.Errorf("restartPolicy %s: a task's pod runs once (Never): a retry is a new pod", spec.RestartPolicy)
	}
	if err := checkIsolation(&t, task); err != nil {
		return t, err
	}
	switch m := t.ObjectMeta; {
	case len(m.OwnerReferences) > 0:
		// Its owner's deletion would delete the pod, and the task.
		return t, errors.New("metadata.ownerReferences: a task's pod has no owner, so that no deletion of another object takes it")
	case len(m.Finalizers) > 0:
		return t, errors.New("metadata.finalizers: a task's pod is deleted by dama and Kubernetes alone, and never left stuck deleting")
	case m.Name != "", m.GenerateName != "", m.Namespace != "":
		return t, errors.New("metadata: name and namespace are dama's (dama-<task>-<run>, in kubernetes.namespace)")
	}
	for l := range t.Labels {
		if l == LabelManagedBy || strings.HasPrefix(l, "dama.dev/") {
			return t, fmt.Errorf("label %s is dama's", l)
		}
	}
	return t, nil
}

// keepNetRaw returns the containers of spec, but the task's, whose
// runtime's default NET_RAW their security context does not drop (adding
// it leaves the Baseline standard, which checkIsolation refuses): a
// sidecar shares the pod's network with the task process as the command
// does, whose container dama makes drop it.
func keepNetRaw(spec corev1.PodSpec) []string {
	var keep []string
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		if c.Name == containerTask {
			continue
		}
		var caps corev1.Capabilities
		if c.SecurityContext != nil && c.SecurityContext.Capabilities != nil {
			caps = *c.SecurityContext.Capabilities
		}
		netRaw := func(list []corev1.Capability) bool {
			return slices.ContainsFunc(list, func(c corev1.Capability) bool {
				name := strings.TrimPrefix(strings.ToUpper(string(c)), "CAP_")
				return name == "ALL" || name == "NET_RAW"
			})
		}
		if !netRaw(caps.Drop) {
			keep = append(keep, c.Name)
		}
	}
	return keep
}

// checkIsolation refuses what would let a process of the pod other than
// dama's reach dama's volumes (the Secret, the shim's socket and
// program), run before the shim in the task's container, or leave the
// isolation of the Baseline Pod Security Standard (host namespaces,
// hostPath volumes, privilege, capabilities, unconfined seccomp or
// AppArmor, ...), through which it could reach dama's container. The
// standard is Kubernetes' own checks (k8s.io/pod-security-admission), of
// the Kubernetes release of the client.
func checkIsolation(t *corev1.PodTemplateSpec, task *corev1.Container) error {
	spec := &t.Spec
	dama := func(name string) bool {
		return name == volumeRun || name == volumeSecrets || name == volumeLogs || name == volumeTLS
	}
	if task.Lifecycle != nil || task.LivenessProbe != nil || task.ReadinessProbe != nil || task.StartupProbe != nil {
		// A hook or a probe runs in the task's container before the
		// command, beside the shim: it could take the shim's place.
		return errors.New("containers.task: lifecycle hooks and probes would run beside dama's shim; a task's container has none")
	}
	for _, v := range spec.Volumes {
		if dama(v.Name) {
			return fmt.Errorf("volume name %s is dama's", v.Name)
		}
	}
	var all []corev1.Container
	all = append(append(all, spec.InitContainers...), spec.Containers...)
	for _, c := range all {
		for _, m := range c.VolumeMounts {
			if at := path.Clean("/" + m.MountPath); dama(m.Name) || at == runDir || strings.HasPrefix(at, runDir+"/") {
				return fmt.Errorf("container %s: mounts %s at %s, which are dama's", c.Name, m.Name, m.MountPath)
			}
		}
		for _, d := range c.VolumeDevices {
			if dama(d.Name) {
				return fmt.Errorf("container %s: volume %s is dama's", c.Name, d.Name)
			}
		}
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return fmt.Errorf("the Pod Security Standards' checks: %w", err)
	}
	baseline := api.LevelVersion{Level: api.LevelBaseline, Version: api.LatestVersion()}
	if res := policy.AggregateCheckResults(evaluator.EvaluatePod(baseline, &t.ObjectMeta, spec)); !res.Allowed {
		return fmt.Errorf("leaves the Baseline Pod Security Standard, whose isolation keeps the command from dama's container: %s", res.ForbiddenDetail())
	}
	return nil
}

// PodName is the name of the pod of run runID of task id.
func PodName(id int64, runID string) string {
	run := strings.ReplaceAll(runID, "-", "")
	return "dama-" + strconv.FormatInt(id, 10) + "-" + run[:min(12, len(run))]
}

// restricted is the security context of dama's containers: the restricted
// Pod Security Standard's.
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsUser:                new(int64(imageUser)),
		RunAsGroup:               new(int64(imageUser)),
		RunAsNonRoot:             new(true),
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// build returns the pod of l.
func (r *Launcher) build(l launch) (*corev1.Pod, error) {
	k, ok := r.kinds[l.Kind]
	if !ok {
		return nil, fmt.Errorf("kind %s does not run on kubernetes here", l.Kind)
	}
	t := k.template.DeepCopy()
	pod := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Name, pod.GenerateName, pod.Namespace = PodName(l.ContextID, l.RunID), "", r.namespace
	if pod.Labels == nil {
		pod.Labels = map[string]string{}
	}
	for name, v := range r.labels(l.ContextID, l.RunID, l.Kind) {
		pod.Labels[name] = v
	}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	// kubectl logs shows the task process's log, which holds the
	// command's output.
	pod.Annotations["kubectl.kubernetes.io/default-container"] = containerDama
	// A task runs for hours: no autoscaler takes its node away under it.
	pod.Annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] = "false"

	spec := &pod.Spec
	spec.RestartPolicy = corev1.RestartPolicyNever
	if spec.TerminationGracePeriodSeconds == nil {
		// The command's kill_grace, and time for the task process to
		// record the outcome.
		spec.TerminationGracePeriodSeconds = new(int64(k.killGrace/time.Second) + 30)
	}
	if spec.AutomountServiceAccountToken == nil && spec.ServiceAccountName == "" {
		spec.AutomountServiceAccountToken = new(false)
	}
	small := resource.MustParse("64Mi")
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: volumeRun, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &small}}},
		corev1.Volume{Name: volumeLogs, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		// Readable by dama's container's user; no other container
		// mounts it.
		corev1.Volume{Name: volumeSecrets, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: pod.Name, DefaultMode: new(int32(0o444))}}},
	)
	runMount := corev1.VolumeMount{Name: volumeRun, MountPath: runDir}
	spec.InitContainers = append([]corev1.Container{{
		Name:            containerShim,
		Image:           r.image,
		Command:         []string{"/" + shimName, "--install", runDir + "/" + shimName},
		VolumeMounts:    []corev1.VolumeMount{runMount},
		SecurityContext: restricted(),
		Resources:       r.resources,
	}}, spec.InitContainers...)
	for i := range spec.Containers {
		if c := &spec.Containers[i]; c.Name == containerTask {
			c.Command = []string{runDir + "/" + shimName, shimSocket}
			// dama's image has dama's programs alone: a command of
			// theirs, as a check that the pods work.
			if c.Image == "" {
				c.Image = r.image
			}
			c.VolumeMounts = append(c.VolumeMounts, runMount)
			// The command shares the pod's network with the task process:
			// raw sockets would let it read and forge the task process's
			// packets to the database.
			if c.SecurityContext == nil {
				c.SecurityContext = &corev1.SecurityContext{}
			}
			if c.SecurityContext.Capabilities == nil {
				c.SecurityContext.Capabilities = &corev1.Capabilities{}
			}
			c.SecurityContext.Capabilities.Drop = append(c.SecurityContext.Capabilities.Drop, "NET_RAW")
			// A process that gained another user's rights through a
			// setuid program would outlive the shim's kill(-1), and keep
			// the attempt from ending; a template that needs them says
			// so.
			if c.SecurityContext.AllowPrivilegeEscalation == nil {
				c.SecurityContext.AllowPrivilegeEscalation = new(false)
			}
		}
	}
	launch := protocol.Launch{
		ContextID: l.ContextID, RunID: l.RunID, LockMode: k.lockMode,
		SecretsFile:   secretsDir + "/" + secretsKey,
		SecretsDigest: protocol.PodDigest(l.Secrets, l.Config),
		LogDir:        logDir,
	}
	spec.Containers = append([]corev1.Container{{
		Name:    containerDama,
		Image:   r.image,
		Command: slices.Concat([]string{taskRunnerPath}, launch.Args(), []string{shim.SocketFlag, shimSocket}),
		Env: []corev1.EnvVar{
			{Name: protocol.ProcessEnv, Value: protocol.ProcessRunner},
			{Name: protocol.ConfigEnv, Value: secretsDir + "/" + configKey},
		},
		VolumeMounts: []corev1.VolumeMount{
			runMount,
			{Name: volumeLogs, MountPath: logDir},
			{Name: volumeSecrets, MountPath: secretsDir, ReadOnly: true},
		},
		SecurityContext: restricted(),
		Resources:       r.resources,
	}}, spec.Containers...)
	if r.tlsSecret != "" {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: volumeTLS, VolumeSource: corev1.VolumeSource{
			Secret: &corev1.SecretVolumeSource{SecretName: r.tlsSecret, DefaultMode: new(int32(0o444))},
		}})
		dama := &spec.Containers[0]
		dama.VolumeMounts = append(dama.VolumeMounts, corev1.VolumeMount{Name: volumeTLS, MountPath: tlsDir, ReadOnly: true})
	}
	return pod, nil
}

// parseResources reads kubernetes.resources, and refuses a request over
// its limit, which every pod's creation would.
func parseResources(raw []byte) (corev1.ResourceRequirements, error) {
	var res corev1.ResourceRequirements
	if err := strict(raw, &res); err != nil {
		return res, fmt.Errorf("not a ResourceRequirements (requests, limits): %w", err)
	}
	if len(res.Claims) > 0 {
		return res, errors.New("claims: dama's containers claim no device")
	}
	for name, limit := range res.Limits {
		if req, ok := res.Requests[name]; ok && req.Cmp(limit) > 0 {
			return res, fmt.Errorf("%s: the request %s is over the limit %s", name, req.String(), limit.String())
		}
	}
	return res, nil
}

// damaResources are what dama's containers ask for by default
// (config.Kubernetes.Resources).
func damaResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
	}
}

func (r *Launcher) labels(id int64, runID, kind string) map[string]string {
	return map[string]string{LabelManagedBy: managedBy, LabelTask: strconv.FormatInt(id, 10), LabelRun: runID, LabelKind: kind}
}

// launch is one attempt of a task to run in a pod.
type launch struct {
	ContextID int64
	RunID     string
	Kind      string
	// Secrets is what the pod's task process reads from its secrets file
	// (protocol.Secrets.Encode), and Config the configuration it runs
	// under (the supervisor's file).
	Secrets, Config []byte
}

// create creates the pod of l, then its Secret, owned by the pod so that
// Kubernetes deletes it with the pod. The kubelet starts the pod's
// containers once the Secret is there.
func (r *Launcher) create(ctx context.Context, l launch) error {
	pod, err := r.build(l)
	if err != nil {
		return err
	}
	created, err := r.core.Pods(r.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		// A creation that timed out may have landed: without its
		// Secret, the pod would wait out start_timeout.
		if !apierrors.IsAlreadyExists(err) {
			if derr := r.delete(context.WithoutCancel(ctx), pod.Name); derr != nil {
				err = errors.Join(err, derr)
			}
		}
		return fmt.Errorf("create the task's pod: %w", &unnamed{err, pod.Name})
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: pod.Name, Namespace: r.namespace, Labels: r.labels(l.ContextID, l.RunID, l.Kind),
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: created.Name, UID: created.UID}},
		},
		Immutable: new(true),
		Data:      map[string][]byte{secretsKey: l.Secrets, configKey: l.Config},
	}
	if _, err = r.core.Secrets(r.namespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		// A pod without its Secret would wait for it forever; one
		// whose Secret someone else made first must not run.
		if derr := r.delete(context.WithoutCancel(ctx), pod.Name); derr != nil {
			err = errors.Join(err, derr)
		}
		return fmt.Errorf("create the Secret of the task's pod: %w", &unnamed{err, pod.Name})
	}
	r.logger.Info("created pod", "pod", pod.Name, "namespace", r.namespace, "etl_context_id", l.ContextID, "kind", l.Kind)
	return nil
}

// unnamed is err said without the pod's name, which changes with each
// run: the same refusal (a quota, an admission policy) reads the same at
// every launch, and is recorded once.
type unnamed struct {
	err  error
	name string
}

func (e *unnamed) Error() string {
	return strings.ReplaceAll(e.err.Error(), e.name, "dama-<task>-<run>")
}
func (e *unnamed) Unwrap() error { return e.err }

// Pod returns what Kubernetes says of the pod of run runID of task id.
func (r *Launcher) Pod(ctx context.Context, id int64, runID string) (State, error) {
	pod, err := r.core.Pods(r.namespace).Get(ctx, PodName(id, runID), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return State{}, nil
	case err != nil:
		return State{}, fmt.Errorf("read pod %s: %w", PodName(id, runID), err)
	}
	return stateOf(pod), nil
}

// stateOf is what pod's status says.
func stateOf(pod *corev1.Pod) State {
	st := State{Exists: true, Created: pod.CreationTimestamp.Time, Node: pod.Spec.NodeName,
		Ended: pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed}
	// The phase alone is not the kubelet's word: the pod garbage
	// collector marks Failed the pods of a node that was deleted, whose
	// containers may run on; each container's status is the kubelet's.
	st.Over = st.Ended && len(pod.Status.ContainerStatuses) == len(pod.Spec.Containers)
	for _, c := range append(slices.Clone(pod.Status.InitContainerStatuses), pod.Status.ContainerStatuses...) {
		// ContainerStatusUnknown is the kubelet's guess for a container
		// its runtime no longer lists, not its word that it ended.
		if t := c.State.Terminated; t == nil || t.Reason == "ContainerStatusUnknown" {
			st.Over = false
		}
		if c.Name == containerDama && (c.State.Running != nil || c.State.Terminated != nil) {
			st.Started = true
		}
		if t := c.State.Terminated; c.Name == containerDama && t != nil && t.Reason != "ContainerStatusUnknown" {
			st.HolderEnded = true
		}
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue && cond.Reason == "DeletionByPodGC" {
			st.Over = false
		}
	}
	st.Reason = reasonOf(pod)
	return st
}

// reasonOf says, in Kubernetes' words, why pod waits or ended, if that is
// of note.
func reasonOf(pod *corev1.Pod) string {
	if pod.Status.Reason != "" {
		// Evicted, NodeLost, DeadlineExceeded, ...
		return said(pod.Status.Reason, pod.Status.Message)
	}
	for _, c := range pod.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil && t.Reason != "" && t.Reason != "Completed" && t.Reason != "Error" {
			return fmt.Sprintf("container %s %s (exit code %d)", c.Name, t.Reason, t.ExitCode)
		}
	}
	for _, c := range append(pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses...) {
		if w := c.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return said(fmt.Sprintf("container %s %s", c.Name, w.Reason), w.Message)
		}
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodScheduled && cond.Status == corev1.ConditionFalse {
			return said(cond.Reason, cond.Message)
		}
	}
	var notes []string
	if since, ok := nodeSilent(pod); ok {
		notes = append(notes, fmt.Sprintf("its node %s stopped reporting to Kubernetes (the pod not ready since %s)", pod.Spec.NodeName, since.UTC().Format(time.RFC3339)))
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.DisruptionTarget && cond.Status == corev1.ConditionTrue {
			// DeletionByTaintManager (from a lost node), EvictionByEvictionAPI,
			// PreemptionByScheduler, ...
			return strings.Join(append(notes, said(cond.Reason, cond.Message)), "; ")
		}
	}
	if pod.DeletionTimestamp != nil {
		notes = append(notes, "deleted")
	}
	return strings.Join(notes, "; ")
}

// said is a reason and its message, as Kubernetes gives them.
func said(reason, message string) string {
	if message = strings.TrimSpace(message); message == "" {
		return reason
	}
	return reason + ": " + message
}

// nodeSilent reports whether the last the kubelet said of pod is that all
// its containers run, while the pod is marked not ready without a reason,
// and since when: only the node controller marks a pod so, when its node
// stops reporting.
func nodeSilent(pod *corev1.Pod) (time.Time, bool) {
	if pod.Status.Phase != corev1.PodRunning || len(pod.Status.ContainerStatuses) == 0 {
		return time.Time{}, false
	}
	for _, c := range pod.Status.ContainerStatuses {
		if c.State.Running == nil {
			return time.Time{}, false
		}
	}
	for _, cond := range pod.Status.Conditions {
		// The kubelet says why (ContainersNotReady, ReadinessGatesNotReady);
		// the node controller keeps the reason of the kubelet's ready,
		// none.
		if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionFalse && cond.Reason == "" {
			return cond.LastTransitionTime.Time, true
		}
	}
	return time.Time{}, false
}

// Delete deletes the pod of run runID of task id, if it is there; its
// Secret goes with it.
func (r *Launcher) Delete(ctx context.Context, id int64, runID string) error {
	return r.delete(ctx, PodName(id, runID))
}

func (r *Launcher) delete(ctx context.Context, name string) error {
	err := r.core.Pods(r.namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete pod %s: %w", name, err)
	}
	return nil
}

// Prune deletes the pods of this configuration's kinds that ended longer
// ago than their kind's pod_retention.
func (r *Launcher) Prune(ctx context.Context) error {
	var errs []error
	opts := metav1.ListOptions{LabelSelector: LabelManagedBy + "=" + managedBy, Limit: 500}
	for {
		// In pages: a namespace may keep thousands of finished pods.
		list, err := r.core.Pods(r.namespace).List(ctx, opts)
		if err != nil {
			return errors.Join(append(errs, fmt.Errorf("list dama's pods: %w", err))...)
		}
		for i := range list.Items {
			if err := r.prune(ctx, &list.Items[i]); err != nil {
				errs = append(errs, err)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return errors.Join(errs...)
		}
	}
}

// prune deletes pod if it is past its kind's pod_retention, or was left
// by a launch taken back.
func (r *Launcher) prune(ctx context.Context, pod *corev1.Pod) error {
	k, ok := r.kinds[pod.Labels[LabelKind]]
	if !ok || pod.DeletionTimestamp != nil {
		return nil
	}
	st := stateOf(pod)
	switch {
	case !st.Over && !st.Started && time.Since(st.Created) > k.startTimeout:
		// A pod left by a launch taken back (a creation that landed
		// after its step gave up on it): its task process never
		// started, and no longer can.
	case gaveUp(pod):
		// Its task process found its run taken back or its task
		// finished (cancelled while the pod started): it ran nothing.
	case !st.Over && !st.HolderEnded:
		return nil
	case time.Since(endOf(pod)) < max(k.retention, recordDeath):
		// Counted from its task process's end: a sidecar of the
		// template's that never ends keeps the pod from being over,
		// not from being deleted. The step that records a death
		// without an outcome reads Kubernetes' reason from the pod:
		// kept a little while for it even at pod_retention 0s (which
		// the step's own deletion serves otherwise).
		return nil
	}
	return r.delete(ctx, pod.Name)
}

// gaveUp reports whether pod's task process exited without running the
// command, its run no longer current.
func gaveUp(pod *corev1.Pod) bool {
	for _, c := range pod.Status.ContainerStatuses {
		if t := c.State.Terminated; c.Name == containerDama && t != nil && t.Reason != "ContainerStatusUnknown" {
			return t.ExitCode == protocol.ExitLocked || t.ExitCode == protocol.ExitFinished
		}
	}
	return false
}

// recordDeath is how long a finished pod is kept at the least, for the
// step that records its attempt's death to read why it ended.
const recordDeath = 10 * time.Minute

// endOf is when the last of pod's containers ended, or its creation when
// none says.
func endOf(pod *corev1.Pod) time.Time {
	end := pod.CreationTimestamp.Time
	for _, c := range pod.Status.ContainerStatuses {
		if t := c.State.Terminated; t != nil && t.FinishedAt.After(end) {
			end = t.FinishedAt.Time
		}
	}
	return end
}
