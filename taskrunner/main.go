package taskrunner

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

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/version"
)

// Main is the task processes' own program (cmd/dama-taskrunner, and the
// Kubernetes module's beside its dama): it runs the task process its
// environment names, a runner with starter (Options.Starter) unless nil,
// and exits.
func Main(starter Starter) {
	// First thing, as every dama program: the environment holds the
	// database URL, which the task's command, of the same user, must not
	// read (see Run).
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
	// themselves (Run, RunKeeper): this context is a function process's.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code, ok := runProcess(ctx, nil, starter)
	stop()
	if ok {
		os.Exit(code)
	}
	fmt.Fprintf(os.Stderr, "dama-taskrunner: runs a dama task process, started by a dama supervisor (%s is not set)\n", protocol.ProcessEnv)
	os.Exit(2)
}
