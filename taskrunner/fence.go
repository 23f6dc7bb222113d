package taskrunner

import (
	"fmt"
	"net"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Server-side TCP keepalives of the lock connection. A host that vanishes
// (power cut, partition) stops answering; without them the server would
// hold its lock until the kernel gives up on the socket, about 2h11m with
// Linux's defaults. With them the server ends the session, and so releases
// the lock, at most LockReleaseBound after the last packet it received.
// They apply to TCP connections only (not Unix sockets).
const (
	keepaliveIdle     = 10 * time.Second
	keepaliveInterval = 5 * time.Second
	keepaliveCount    = 3
	// LockReleaseBound is how long after a task's host went silent the
	// server releases its lock.
	LockReleaseBound = keepaliveIdle + keepaliveCount*keepaliveInterval
)

// fenceMargin covers what the bounds below do not: scheduling delays and
// the difference between the runner's clock rate and the database's.
const fenceMargin = 2 * time.Second

// A task process's lock connection is watched without a single statement:
// the runner waits on it, so a backend ended by the server (a restart,
// pg_terminate_backend) is noticed at once, and the kernel probes it when it
// has been silent for heartbeat_interval (TCP keepalive, client side), so a
// connection that went silent without a reset fails within LockSilenceBound.
// Nothing is sent to the server while all is well: a running task costs it
// no transaction and no statement.
const lockProbeCount = 3

// lockProbeIdle is how long the lock connection stays silent before the
// kernel probes it: heartbeat_interval, in the kernel's whole seconds.
func lockProbeIdle(heartbeat time.Duration) time.Duration {
	return max(heartbeat.Round(time.Second), time.Second)
}

// lockProbeInterval spaces the probes: half the idle time, within [1s, 5s].
func lockProbeInterval(heartbeat time.Duration) time.Duration {
	return min(max((heartbeat/2).Round(time.Second), time.Second), 5*time.Second)
}

// LockSilenceBound is how long after its lock connection went silent a task
// process notices: the idle time plus lockProbeCount unanswered probes.
func LockSilenceBound(heartbeat time.Duration) time.Duration {
	return lockProbeIdle(heartbeat) + lockProbeCount*lockProbeInterval(heartbeat)
}

// lockConnectTimeout bounds making a lock connection and taking the lock on
// it, so that a silent server is given up on and tried again.
func lockConnectTimeout(heartbeat time.Duration) time.Duration {
	return min(max(4*heartbeat, 2*time.Second), 20*time.Second)
}

// firstLockTimeout bounds the first take of the lock. Nothing runs yet, so
// a slow start is waited on like any statement, rather than given up on as
// a silent server: a CI host at load 17 on 2 cores took 1.7 s to start a
// lock keeper and 2.3 s to open a session with it. Past the supervisor's
// launch timeout (10 s too) a step may give the launch back, under the
// lock: the runner then finds its run is no longer current, and exits.
func firstLockTimeout(heartbeat time.Duration) time.Duration {
	return max(lockConnectTimeout(heartbeat), stmtTimeout)
}

// FenceWindow is how long a supervisor on another host, which cannot look
// at the processes, waits after it first found a task's lock free (timed on
// the database's clock) before it starts a new attempt. A live task process
// runs its command for at most this long after its lock was released: it
// notices the loss within LockSilenceBound, tries to take the lock again for
// reconnectGrace, then stops its command's process group (SIGTERM, SIGKILL
// after killGrace). A dead one's orphans are found by a supervisor of its
// host within pollInterval (twice that, for slack), which then holds the
// lock until they are gone.
func FenceWindow(heartbeat, reconnectGrace, killGrace, pollInterval time.Duration) time.Duration {
	return max(LockSilenceBound(heartbeat)+reconnectGrace+killGrace, 2*pollInterval) + fenceMargin
}

// probingDialer dials TCP connections that the kernel probes after
// heartbeat of silence and gives up on after LockSilenceBound without an
// answer, whether it waited for a probe's or for a write's
// acknowledgement (TCP_USER_TIMEOUT). Unix sockets cannot go silent.
func probingDialer(heartbeat time.Duration) *net.Dialer {
	bound := LockSilenceBound(heartbeat)
	return &net.Dialer{
		KeepAliveConfig: net.KeepAliveConfig{
			Enable:   true,
			Idle:     lockProbeIdle(heartbeat),
			Interval: lockProbeInterval(heartbeat),
			Count:    lockProbeCount,
		},
		Control: func(network, _ string, rc syscall.RawConn) error {
			if !strings.HasPrefix(network, "tcp") {
				return nil
			}
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(bound.Milliseconds()))
			}); err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("set TCP_USER_TIMEOUT: %w", serr)
			}
			return nil
		},
	}
}
