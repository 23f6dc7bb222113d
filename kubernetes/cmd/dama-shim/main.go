// Command dama-shim is the first process of the user's container in a
// task's pod: it starts the kind's command when the task process in
// dama's container tells it to, relays nothing but the descriptors that
// process hands it, and stops the command when that process is gone. An
// init container copies it into a volume the two containers share, so
// that any image runs a kind's command (docs/kubernetes.md).
//
//	dama-shim SOCKET          run under the task process listening on SOCKET
//	dama-shim --install PATH  copy this program to PATH (the init container)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/dama-etl/dama/kubernetes/shim"
)

func main() {
	var (
		install string
		wait    time.Duration
	)
	flag.StringVar(&install, "install", "", "copy this program to `PATH` and exit")
	flag.DurationVar(&wait, "wait", 5*time.Minute, "how long to wait for the task process's socket")
	flag.Parse()
	if install != "" {
		if err := copySelf(install); err != nil {
			fmt.Fprintln(os.Stderr, "dama-shim: "+err.Error())
			os.Exit(shim.ExitSetup)
		}
		return
	}
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "dama-shim: want one argument, the task process's socket")
		os.Exit(shim.ExitSetup)
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil)).With("component", "dama-shim")
	os.Exit(shim.Run(context.Background(), shim.Options{Socket: flag.Arg(0), Wait: wait, Logger: logger}))
}

// copySelf copies this program to path, executable by anyone: the user's
// container runs it under a uid of its own.
func copySelf(path string) error {
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer self.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o555)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if _, err := io.Copy(f, self); err != nil {
		f.Close()
		return fmt.Errorf("install %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("install %s: %w", path, err)
	}
	return nil
}
