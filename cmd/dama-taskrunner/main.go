// Command dama-taskrunner is the program of dama's task processes: a
// task's runner, which holds its lock and relays its command's events, and
// the host's lock keeper. A supervisor runs it, when it is installed beside
// the dama binary and of the same build, instead of dama itself: it holds
// only what a task process needs, so that each of the host's runners
// touches fewer of its program's pages (docs/performance.md). It is not
// run by hand.
//
//	go install github.com/dama-etl/dama/cmd/dama github.com/dama-etl/dama/cmd/dama-taskrunner
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"unsafe"

	// A kind's schedule names its time zone, which the configuration's
	// check reads: the same rules as the supervisor's, whatever the host
	// has.
	_ "time/tzdata"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/taskrunner"
	"github.com/dama-etl/dama/version"
	"golang.org/x/sys/unix"
)

func main() {
	// First thing, as every dama program: the environment holds the
	// database URL, which the task's command, of the same user, must not
	// read (see taskrunner.Run).
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		fmt.Printf("dama-taskrunner %s (%s)\n", version.Release, version.Commit())
		return
	}
	// Its name in ps and top: executed by its descriptor
	// (/proc/self/fd/N), the kernel names it after N.
	if name, err := unix.BytePtrFromString("dama-taskrunner"); err == nil {
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(name)), 0, 0, 0)
	}
	// As dama's own. A runner and a lock keeper hear their signals
	// themselves (taskrunner.Run, RunKeeper): this context is a function
	// process's.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code, ok := taskrunner.RunProcess(ctx, nil)
	stop()
	if ok {
		os.Exit(code)
	}
	fmt.Fprintf(os.Stderr, "dama-taskrunner: runs a dama task process, started by a dama supervisor (%s is not set)\n", protocol.ProcessEnv)
	os.Exit(2)
}
