// Command quiet is the task command of the scale benchmark. "quiet FILE"
// costs no CPU while it waits, and exits 0 on SIGUSR1, or once FILE exists
// (looked for once a minute, a fallback: a Go process woken once a second
// costs this project's 2-vCPU VM about 0.8 ms of CPU a wake, which 1000
// such commands made most of a core, and a task process's start three
// times as slow; inotify allows 128 instances a user by default). "quiet
// -for DURATION" exits 0 after DURATION.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "-for" {
		d, err := time.ParseDuration(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, "quiet:", err)
			os.Exit(2)
		}
		time.Sleep(d)
		return
	}
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: quiet RELEASE_FILE | quiet -for DURATION")
		os.Exit(2)
	}
	release := make(chan os.Signal, 1)
	signal.Notify(release, syscall.SIGUSR1)
	tick := time.NewTicker(time.Minute)
	for {
		select {
		case <-release:
			return
		case <-tick.C:
		}
		if _, err := os.Stat(os.Args[1]); err == nil {
			return
		}
	}
}
