// Package pods is what a supervisor asks of the runner of its kubernetes
// kinds (config.RunnerKubernetes), without Kubernetes' client: the
// runner, internal/podrunner, is linked into the programs built to run
// pods (go build -tags kubernetes), and the supervisor speaks to it
// through Runner.
package pods

import (
	"context"
	"time"
)

// Launch is one attempt of a task to run in a pod.
type Launch struct {
	ContextID int64
	RunID     string
	Kind      string
	// Secrets is what the pod's task process reads from its secrets file
	// (protocol.Secrets.Encode), and Config the configuration it runs
	// under (the supervisor's file).
	Secrets, Config []byte
}

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

// Runner runs tasks in pods.
type Runner interface {
	// Launch creates the pod of l.
	Launch(ctx context.Context, l Launch) error
	// Pod returns the state of the pod of run runID of task id.
	Pod(ctx context.Context, id int64, runID string) (State, error)
	// Delete deletes the pod of run runID of task id, if it is there.
	Delete(ctx context.Context, id int64, runID string) error
	// Prune deletes the pods that ended longer ago than their kind's
	// pod_retention.
	Prune(ctx context.Context) error
}
