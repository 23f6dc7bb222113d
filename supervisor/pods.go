package supervisor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/pods"
)

// A kubernetes kind's attempt runs in a pod of its own (Options.Pods):
// the supervisor creates it and steps the task as any other, through the
// lock its task process takes in the pod. What Kubernetes adds is asked
// of it where the lock says nothing: whether a pod whose task process has
// not taken its lock yet is still starting, and whether every process of
// a pod whose lock is free is surely gone.

// inPod reports whether c's attempts run in pods here.
func (s *Supervisor) inPod(c *etlcontext.Context) (config.Kind, bool) {
	k, ok := s.cfg.Kind(c.Kind)
	return k, ok && k.Runner == config.RunnerKubernetes && s.opts.Pods != nil
}

// launchPod creates the pod of run of c. Its task process takes the lock
// when the pod starts, which the watch sees as any other's; until then
// the step finds the launch starting (podStarting).
func (s *Supervisor) launchPod(ctx context.Context, logger *slog.Logger, c *etlcontext.Context, run etlcontext.Run, started func(time.Time)) (launchOutcome, error) {
	// The configuration as its file is now: the pod's task process reads
	// it as a host's would.
	cfgFile, err := os.ReadFile(s.cfg.Path)
	if err != nil {
		return 0, fmt.Errorf("read the configuration for the pod: %w", err)
	}
	secrets := s.secrets(run.Key)
	secrets.Keeper = nil
	encoded, err := secrets.Encode()
	if err != nil {
		return 0, err
	}
	if err := s.opts.Pods.Launch(ctx, pods.Launch{ContextID: c.ID, RunID: run.ID, Kind: c.Kind, Secrets: encoded, Config: cfgFile}); err != nil {
		return 0, err
	}
	logger.Info("created the task's pod", "kind", c.Kind)
	s.mu.Lock()
	s.podStarts[c.ID] = started
	s.mu.Unlock()
	return launchPending, nil
}

// podStarted counts the attempt of task id started, once, when this
// supervisor created its pod (launchPod) and at, when its task process
// started, is known; with at nil, it forgets the launch (taken back) without
// counting it.
func (s *Supervisor) podStarted(id int64, at *time.Time) {
	s.mu.Lock()
	started, ok := s.podStarts[id]
	delete(s.podStarts, id)
	s.mu.Unlock()
	if ok && at != nil {
		started(*at)
	}
}

// podStarting decides a launch of c, of kind k, whose task process has
// not recorded its start: errHold while its pod is starting, within the
// kind's start_timeout of its creation; otherwise the pod is deleted (a
// task process that would start in it late finds its run taken back and
// exits), why is recorded in a WARNING, once per attempt, and nil lets the
// launch be taken back in tx. A cancel (requested) takes it back at once.
func (s *Supervisor) podStarting(ctx context.Context, logger *slog.Logger, tx pgx.Tx, c *etlcontext.Context, k config.Kind, cancel bool) error {
	st, err := s.opts.Pods.Pod(ctx, c.ID, *c.RunID)
	if err != nil {
		return s.transient(logger, err)
	}
	// The pod's creation is the API server's time: a skew of the
	// clocks moves the timeout by as much.
	if st.Exists && !st.Ended && !cancel && time.Since(st.Created) < time.Duration(k.StartTimeout) {
		return errHold
	}
	s.podStarted(c.ID, nil)
	var why string
	switch {
	case cancel:
		why = ""
	case !st.Exists:
		failed, ok := s.spawnFailure(c.ID)
		if !ok {
			// Its task process gave the launch back, and it is gone.
			return nil
		}
		why = "its pod could not be created: " + failed
	case st.Ended:
		why = "its pod ended before the command started"
	default:
		why = fmt.Sprintf("its pod did not start the command within start_timeout (%s)", k.StartTimeout)
	}
	if st.Reason != "" && why != "" && st.Exists {
		why += ": " + st.Reason
	}
	if st.Exists {
		logger.Warn("deleting the task's pod and taking the launch back", "reason", cmp.Or(why, "cancel requested"), "node", st.Node)
		if err := s.opts.Pods.Delete(ctx, c.ID, *c.RunID); err != nil {
			return s.transient(logger, err)
		}
	}
	if why == "" {
		return nil
	}
	// An ended pod's task process may have said why, better than the
	// pod's end.
	if err := s.warnUnfit(ctx, tx, c, why, st.Ended); err != nil {
		return s.transient(logger, err)
	}
	return nil
}

// podOver reports whether Kubernetes says every process of the pod of
// c's current run is gone (its kubelet reported each container
// terminated), and what it says of the pod's end, or of its node, in its
// words: no fence window then need pass before the next attempt. A pod
// missing, or the API away, proves nothing (a forced deletion removes the
// object before its node stops it).
func (s *Supervisor) podOver(ctx context.Context, logger *slog.Logger, c *etlcontext.Context) (bool, string) {
	if _, ok := s.inPod(c); !ok || c.RunID == nil {
		return false, ""
	}
	st, err := s.opts.Pods.Pod(ctx, c.ID, *c.RunID)
	if err != nil {
		logger.Warn("read the task's pod; waiting out the fence window", "error", err)
		return false, ""
	}
	why, _ := etlcontext.CleanText(st.Reason)
	return st.Over, why
}

// podRelaunchDelay is how long a task whose pod did not run its command
// waits before the next: a pod costs the cluster a scheduling and the
// start of three containers, and what kept this one from running (an
// image without the command, a quota) rarely passes in seconds.
const podRelaunchDelay = 30 * time.Second

// podPruneEvery is how often a supervisor deletes the pods past their
// kind's pod_retention.
const podPruneEvery = time.Minute

// podPruneLoop deletes the finished pods past their kind's
// pod_retention, every podPruneEvery, until ctx ends.
func (s *Supervisor) podPruneLoop(ctx context.Context) {
	ticker := time.NewTicker(podPruneEvery)
	defer ticker.Stop()
	for {
		if err := s.opts.Pods.Prune(ctx); err != nil && !errors.Is(err, context.Canceled) {
			s.logger.Warn("delete the finished pods past their retention", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// podFinished deletes the pod of c's last run, finished, at once when it
// was cancelled or its kind keeps no finished pod (pod_retention 0s).
func (s *Supervisor) podFinished(ctx context.Context, logger *slog.Logger, c *etlcontext.Context) {
	var at *time.Time
	if c.PID != nil {
		at = cmp.Or(c.ProcessStartedAt, new(time.Now()))
	}
	s.podStarted(c.ID, at)
	if k, ok := s.inPod(c); !ok || c.RunID == nil || (*k.PodRetention > 0 && c.Status != etlcontext.StatusCancelled) {
		return
	}
	if err := s.opts.Pods.Delete(ctx, c.ID, *c.RunID); err != nil {
		logger.Warn("delete the finished task's pod", "error", err)
	}
}
