package scalebench_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// hostsLock is held, with flock, by the run whose hosts live: they take
// fixed names and a fixed network, which a second run would remove
// (removeStale) or collide with.
const hostsLock = "/run/" + hostPrefix + "hosts.lock"

// lockHosts takes the lock file path for a run, and writes the run's pid
// in it; it fails at once when another run holds it.
func lockHosts(path string) (release func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open the hosts' lock: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			who := "another hosts run"
			if pid, _ := os.ReadFile(path); len(bytes.TrimSpace(pid)) > 0 {
				who += " (pid " + string(bytes.TrimSpace(pid)) + ")"
			}
			return nil, fmt.Errorf("%s holds %s: wait for it to end", who, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// For the error of a run that finds it held.
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}

// A second hosts run, while one holds the hosts' lock, fails at once with
// a line that names the first's pid, before it removes or makes anything
// (newCluster): the two would share names and a network.
func TestASecondHostsRunIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hosts.lock")
	release, err := lockHosts(path)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockHosts(path)
	if want := "another hosts run (pid " + strconv.Itoa(os.Getpid()) + ") holds " + path; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("a second run's lock: %v; want an error starting %q", err, want)
	}
	release()
	release, err = lockHosts(path)
	if err != nil {
		t.Fatalf("the lock once the first run let it go: %v", err)
	}
	release()
}
