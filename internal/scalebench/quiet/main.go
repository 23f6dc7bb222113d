// Command quiet is the task command of the scale benchmark. "quiet FILE"
// costs no CPU while it waits, and exits 0 on SIGUSR1, or once FILE exists
// (looked for once a minute, a fallback: a Go process woken once a second
// costs this project's 2-vCPU VM about 0.8 ms of CPU a wake, which 1000
// such commands made most of a core, and a task process's start three
// times as slow; inotify allows 128 instances a user by default). "quiet
// -for DURATION" exits 0 after DURATION.
//
// "quiet FILE DIR" (the hosts benchmark) first takes an exclusive flock on
// DIR/<its task's id>, a directory every host shares, and holds it until it
// exits: should another attempt of the task hold it (two copies at once),
// it appends a line to DIR/violations saying so, and waits all the same.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
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
	if len(os.Args) != 2 && len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: quiet RELEASE_FILE [LOCK_DIR] | quiet -for DURATION")
		os.Exit(2)
	}
	release := make(chan os.Signal, 1)
	signal.Notify(release, syscall.SIGUSR1)
	if len(os.Args) == 3 {
		if err := lockTask(os.Args[2]); err != nil {
			fmt.Fprintln(os.Stderr, "quiet:", err)
			os.Exit(2)
		}
	}
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

// lockTask takes the task's flock in dir, recording a violation when
// another process holds it. The file stays open, so the lock lives as long
// as the process.
func lockTask(dir string) error {
	id := os.Getenv("DAMA_ETL_CONTEXT_ID")
	if id == "" {
		return fmt.Errorf("DAMA_ETL_CONTEXT_ID is not set")
	}
	f, err := os.OpenFile(filepath.Join(dir, id), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
		return nil
	} else if err != syscall.EWOULDBLOCK {
		return fmt.Errorf("flock %s: %w", f.Name(), err)
	}
	host, _ := os.Hostname()
	v, err := os.OpenFile(filepath.Join(dir, "violations"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer v.Close()
	_, err = fmt.Fprintf(v, "task %s: attempt %s (run %s) on %s started while another process held its lock\n",
		id, os.Getenv("DAMA_ATTEMPT"), os.Getenv("DAMA_RUN_ID"), host)
	return err
}
