// Package dama is what a Go program needs to use dama's tasks: a [Client]
// submits them (in the program's own transaction if it likes), waits for
// their end, cancels and retries them, and pauses queues and blocks kinds.
// It runs nothing: package supervisor is the daemon that runs the tasks,
// and package etlcontext names what a task is ([etlcontext.Context],
// [etlcontext.Status]).
//
// A Client submits only the kinds of its [config.Config]; a supervisor runs
// only those of its own. A task is a QUEUED context, its INITIAL event and
// its River job, made in one transaction by data_manager.create_task, so a
// program, the dama command and SQL submit alike. Any program reads a
// task's status with plain SQL, from data_manager.dama_task_queue.
package dama
