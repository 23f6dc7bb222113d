// Package taskrunner is the detached process that runs one attempt of one
// task (`dama taskrunner`, started by the supervisor).
//
// It takes the context's lock and holds it for as long as it lives: the lock
// is the proof that the task is running, and a second runner for the same
// context exits at once with protocol.ExitLocked. In row lock mode that is an
// advisory lock keyed by the context id and the INITIAL event row FOR
// UPDATE, in a transaction left open on a connection of its own, with the
// writes on a second connection; in advisory lock mode, the advisory lock at
// session level, with no transaction open, on the one connection that also
// carries the writes. Every write carries the attempt's run id, which the
// database checks. While the task runs quietly nothing is sent to the
// server: the lock connection is watched by waiting on it, and probed by the
// kernel when silent.
//
// The kind's command runs as the runner's child in its own process group,
// with its stdin on /dev/null, its output appended to the task's log file and
// a pipe on descriptor 3 for the events it reports. The runner is the
// subreaper of the command's processes, and once the command ends it kills
// what is left of them, found in its own tree, before recording the
// outcome. The command gets SIGKILL when the runner dies; its descendants
// are then left to the supervisor, which finds them by process group and
// DAMA_RUN_ID. When the lock connection
// fails, the command runs on for at most reconnect_grace while the lock is
// taken again under the same run, then its process group is stopped: it
// runs unlocked for at most FenceWindow. A Starter (Options.Starter)
// starts the command elsewhere instead: the Kubernetes module's, in the
// user's container of the task's pod.
//
// A function kind's command is the runner's own program, started again to
// call the kind's Func with a Task (see RunFunction): everything above
// holds for it unchanged.
package taskrunner
