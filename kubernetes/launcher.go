package kubernetes

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/supervisor"
)

// State is what Kubernetes says of the pod of a run.
type State struct {
	// Exists: the pod is there (being deleted or not).
	Exists bool
	// Created is when it was created.
	Created time.Time
	// Started: the pod's task process's container runs or ran.
	Started bool
	// Over: the kubelet reported every container of the pod terminated,
	// or the pod was deleted after it was: none of its processes runs.
	Over bool
	// Ended: the pod's phase is Succeeded or Failed, which is not the
	// kubelet's word for each container (Over).
	Ended bool
	// HolderEnded: the kubelet reported the task process's container
	// terminated.
	HolderEnded bool
	// Reason says why the pod waits (ImagePullBackOff, Unschedulable: ...)
	// or ended (OOMKilled, Evicted: ...), in Kubernetes' words; empty when
	// nothing is of note.
	Reason string
	// Node is the node it was scheduled on.
	Node string
}

// relaunchDelay is how long a task whose pod did not run its command
// waits before the next: a pod costs the cluster a scheduling and the
// start of three containers, and what kept this one from running (an
// image without the command, a quota) rarely passes in seconds.
const relaunchDelay = 30 * time.Second

// Launch creates the pod of l, with the configuration as its file is now:
// the pod's task process reads it as a host's would. The pod's task
// process takes the lock when the pod starts (LaunchPending).
func (r *Launcher) Launch(ctx context.Context, l supervisor.Launch) (supervisor.LaunchOutcome, error) {
	cfgFile, err := os.ReadFile(r.configPath)
	if err != nil {
		return 0, fmt.Errorf("read the configuration for the pod: %w", err)
	}
	// A pod has no lock keeper of its host to speak to.
	l.Secrets.Keeper = nil
	secrets, err := l.Secrets.Encode()
	if err != nil {
		return 0, err
	}
	c := l.Task
	if err := r.create(ctx, launch{ContextID: c.ID, RunID: l.Run.ID, Kind: c.Kind, Secrets: secrets, Config: cfgFile}); err != nil {
		return 0, err
	}
	l.Logger.Info("created the task's pod", "kind", c.Kind)
	return supervisor.LaunchPending, nil
}

// Starting holds a launch of c while its pod is starting, within the
// kind's start_timeout of its creation; otherwise it deletes the pod (a
// task process that would start in it late finds its run taken back and
// exits) and says why. A cancel takes it back at once.
func (r *Launcher) Starting(ctx context.Context, c *etlcontext.Context, failed string, cancel bool) (supervisor.Start, error) {
	k, ok := r.kinds[c.Kind]
	if !ok {
		return supervisor.Start{}, fmt.Errorf("kind %s does not run on kubernetes here", c.Kind)
	}
	st, err := r.Pod(ctx, c.ID, *c.RunID)
	if err != nil {
		return supervisor.Start{}, err
	}
	// The pod's creation is the API server's time: a skew of the
	// clocks moves the timeout by as much.
	if st.Exists && !st.Ended && !cancel && time.Since(st.Created) < k.startTimeout {
		return supervisor.Start{Hold: true}, nil
	}
	start := supervisor.Start{Again: relaunchDelay, WhyIfUntold: st.Ended}
	switch {
	case cancel:
		start.Again = 0
	case !st.Exists && failed == "":
		// Its task process gave the launch back, and it is gone.
	case !st.Exists:
		start.Why = "its pod could not be created: " + failed
	case st.Ended:
		start.Why = "its pod ended before the command started"
	default:
		start.Why = fmt.Sprintf("its pod did not start the command within start_timeout (%s)", k.startTimeout)
	}
	if st.Reason != "" && start.Why != "" && st.Exists {
		start.Why += ": " + st.Reason
	}
	if st.Exists {
		r.logger.Warn("deleting the task's pod and taking the launch back", "etl_context_id", c.ID, "reason", cmp.Or(start.Why, "cancel requested"), "node", st.Node)
		if err := r.Delete(ctx, c.ID, *c.RunID); err != nil {
			return supervisor.Start{}, err
		}
	}
	return start, nil
}

// Gone is GoneSurely when the kubelet reported every container of the pod
// of c's current run terminated, with what Kubernetes says of the pod's
// end (OOMKilled, Evicted, deleted...). A pod missing, or the API away,
// proves nothing (a forced deletion removes the object before its node
// stops it): GoneUnknown, with what Kubernetes says of its node, whose
// processes may run on, cut off, until the fence window has passed.
func (r *Launcher) Gone(ctx context.Context, c *etlcontext.Context) (supervisor.Gone, string) {
	if c.RunID == nil {
		return supervisor.GoneUnknown, ""
	}
	st, err := r.Pod(ctx, c.ID, *c.RunID)
	if err != nil {
		r.logger.Warn("read the task's pod; waiting out the fence window", "etl_context_id", c.ID, "error", err)
		return supervisor.GoneUnknown, ""
	}
	why, _ := etlcontext.CleanText(st.Reason)
	switch {
	case st.Over && why != "":
		return supervisor.GoneSurely, "the task's pod ended without a result: " + why
	case st.Over:
		return supervisor.GoneSurely, ""
	case why != "":
		return supervisor.GoneUnknown, "the task process was lost without a result: " + why
	}
	return supervisor.GoneUnknown, ""
}

// Finished deletes the pod of c's last run at once when c was cancelled
// or its kind keeps no finished pod (pod_retention 0s); Prune deletes the
// others.
func (r *Launcher) Finished(ctx context.Context, c *etlcontext.Context) {
	k, ok := r.kinds[c.Kind]
	if !ok || c.RunID == nil || (k.retention > 0 && c.Status != etlcontext.StatusCancelled) {
		return
	}
	if err := r.Delete(ctx, c.ID, *c.RunID); err != nil {
		r.logger.Warn("delete the finished task's pod", "etl_context_id", c.ID, "error", err)
	}
}
