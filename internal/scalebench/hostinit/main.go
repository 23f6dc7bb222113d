// Command hostinit is the first process of one host of the hosts benchmark
// (internal/scalebench BenchmarkHosts): started in new PID, mount, UTS and
// network namespaces, "hostinit NAME" mounts a /proc of its PID namespace,
// takes NAME for its host name, and then reaps whatever is left to it, as
// an init does: dama's task processes and lock keepers outlive their
// parents, and a zombie would pass for a live process. Killing it (SIGKILL
// from outside its namespace) kills every process of the host.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) != 2 || os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "usage: hostinit NAME, as the first process of a new PID namespace")
		os.Exit(2)
	}
	exited := make(chan os.Signal, 1)
	signal.Notify(exited, syscall.SIGCHLD)
	// Private first: the /proc mounted next must not propagate to the
	// namespace it was copied from.
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		fail("make / private", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		fail("mount /proc", err)
	}
	if err := syscall.Sethostname([]byte(os.Args[1])); err != nil {
		fail("set the host name", err)
	}
	fmt.Println("ready")
	for {
		for {
			if pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
		<-exited
	}
}

func fail(what string, err error) {
	fmt.Fprintf(os.Stderr, "hostinit: %s: %v\n", what, err)
	os.Exit(1)
}
