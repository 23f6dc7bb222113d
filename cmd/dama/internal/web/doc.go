// Package web serves dama's status page (`dama web`): the tasks, a task's
// arguments, events, attempts and log, the queues, and the operator's
// actions, over the same database as the supervisors. It reads the views
// and the event store, never a task's lock, so it blocks no task.
//
// The pages are static files embedded in the binary; a small script reads
// the JSON API under /api/ every second. Actions are POST requests that
// carry the token in TokenHeader: a cross-site form cannot set a header,
// and a cross-site script cannot without a CORS preflight, which the
// server never grants.
package web
