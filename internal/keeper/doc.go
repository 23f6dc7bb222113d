// Package keeper is a host's lock keeper: in lock_mode host, one process
// per supervisor and host holds the locks of all the host's task
// processes on one server session, so that a task costs no connection of
// its own.
//
// A task process that finds no keeper starts one (Serve, from the task
// process's own program) and talks to it over a Unix socket in a
// directory closed to other users (Dir, SocketPath). Each side first
// proves it knows the supervisor's random secret, bound to the two
// processes the kernel names as the socket's ends (stream.go), then the
// task process opens a session with its run's key, which the keeper
// checks against the database as it takes the session's lock, before it
// runs any statement for it. The session is the lock: the keeper holds
// the context's advisory lock for as long as the session lives, runs the
// task process's statements on a small pool, and passes on the
// notifications it listens to (Conn). A session that ends, because the
// task process died or the keeper did, releases the lock, as a closed
// connection would; a task process whose keeper died finds or starts
// another and takes its lock again within reconnect_grace.
//
// The messages are JSON in frames of a bounded length (stream.go), and
// fuzzed: any process of the user may write to the socket.
package keeper
