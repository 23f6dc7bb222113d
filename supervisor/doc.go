// Package supervisor enqueues dama tasks through River and keeps each one
// moving until it is finished, whatever happens to the supervisor process in
// between.
//
// Every context has one River job for its whole life. The job's Work is a
// short, idempotent step of a state machine, never a days-long wait: it tries
// the context's lock without waiting and decides from what it finds.
//
//   - finished: the job completes (DONE), is cancelled (CANCELLED) or fails
//     for good (FAILED);
//   - lock held: a task process is alive, whoever started it: the Work
//     holds the job, River's 'running', on no connection and in no step
//     slot, until the task ends, and gives it back after 30 minutes (or
//     when its supervisor stops) to be held again by any supervisor (this
//     is how a restarted supervisor, on any host, adopts the tasks of the
//     one before);
//   - lock free but RUNNING recorded: that attempt died (or lost its lock and
//     is stopping its command): once its command is surely gone, an ERROR is
//     recorded and the step returns an error, so River retries with backoff;
//   - lock free and not started: a taskrunner process is spawned, detached,
//     and the job is held.
//
// A held job costs a running task nothing but a goroutine: the hold ends
// when the supervisor reaps a runner it spawned, when a LISTEN connection
// hears that one it adopted exited, or when the watch, once per poll
// interval, finds a RUNNING task's lock free (one statement on pg_locks).
// A task that waits for a slot has its job parked, snoozed for an hour, and
// woken when a slot frees.
//
// # Submitting and cancelling
//
// Package dama's Client submits tasks (a QUEUED context, its INITIAL event
// and its River job in one transaction) and cancels them, wherever they
// run. Only the kinds of a supervisor's [config.Config] run under it.
//
// # Nothing is lost
//
// A step returns an error to River only after the database recorded the
// failed attempt, so River's attempt count and the context's agree. Each
// supervisor holds an advisory lock keyed by its River client id, on a
// connection of its own that it re-opens at once when it fails; a job left
// running by a supervisor whose lock has been seen missing for a grace
// period (max(2*poll_interval, 10s)) is made available again without
// spending an attempt. A context whose job was finalized behind dama's back
// (by hand, or by River's own rescuer) is reconciled: its job is retried or
// re-enqueued, once, however many supervisors reconcile at the same time.
//
// # Releases
//
// [Supervisor.Run] refuses a database migrated by a newer release than its
// own, or one that no longer accepts its task processes' protocol, before
// it touches any task. A supervisor already running when the database
// retires its protocol stops at its first launch, which its task process
// refuses (protocol.ExitRefused): the launch is taken back without
// spending an attempt, and Run returns why.
//
// # Function kinds
//
// A Go program can embed the supervisor and write tasks as Go functions
// ([taskrunner.Func]) of kinds that name them (config.Kind.Function). It
// gives them to [New] in Options.Funcs and calls [RunTaskProcess] first in
// main: the supervisor starts the program again as each task's runner,
// and the runner starts it a third time to call the function, in a process
// it stops like a command's. Lock, fencing, retries from the last
// checkpoint, timeouts, cancellation and adoption are those of command
// kinds.
package supervisor
