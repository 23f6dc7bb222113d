// Package supervisor enqueues dama tasks through River and keeps each one
// moving until it is finished, whatever happens to the supervisor process in
// between. docs/architecture.md ("The supervisor's state machine") is the
// design this package implements: what each step decides, why a running
// task's job is held, and how the steps of dead supervisors are rescued.
//
// Every context has one River job for its whole life, whose Work steps the
// context and, while its task process holds the context's lock, holds the
// job: a restarted supervisor, on any host, adopts the tasks of the one
// before. Package dama's Client submits and cancels tasks; only the kinds of
// a supervisor's [config.Config] run under it. [Supervisor.Run] refuses a
// database migrated by a newer release, or one that no longer accepts its
// task processes' protocol, and stops when the database retires it.
//
// A Go program can embed the supervisor and write tasks as Go functions
// ([taskrunner.Func]) of kinds that name them (config.Kind.Function). It
// gives them to [New] in Options.Funcs and calls [RunTaskProcess] first in
// main. Lock, fencing, retries from the last checkpoint, timeouts,
// cancellation and adoption are those of command kinds.
package supervisor
