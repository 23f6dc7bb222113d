package runas

import (
	"encoding/binary"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// accessACL is a system.posix_acl_access value that grants uid only
// search (execute), its owner everything and nobody else anything.
func accessACL(uid uint32) []byte {
	const all = 0xffffffff
	entries := [][3]uint32{{0x01, 7, all}, {0x02, 1, uid}, {0x04, 0, all}, {0x10, 1, all}, {0x20, 0, all}}
	b := binary.LittleEndian.AppendUint32(nil, 2)
	for _, e := range entries {
		b = binary.LittleEndian.AppendUint16(b, uint16(e[0]))
		b = binary.LittleEndian.AppendUint16(b, uint16(e[1]))
		b = binary.LittleEndian.AppendUint32(b, e[2])
	}
	return b
}

// The kernel says what a user may run: a directory it may not search is
// named, then a file it may not execute, or read if a script; a group or
// an ACL that lets it through is not refused, whatever the mode bits say.
func TestCanRunAsksTheKernelAsTheUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching credentials needs root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skipf("no user nobody: %v", err)
	}
	id, err := Lookup("nobody", "")
	if err != nil {
		t.Fatal(err)
	}
	// The process's credentials as its listings show them, its main
	// thread's (which Go parks rather than ends), and whether it is
	// dumpable, are as before CanRun, whichever threads asked.
	leader := func() string {
		b, err := os.ReadFile("/proc/self/status")
		if err != nil {
			t.Fatal(err)
		}
		var creds []string
		for _, l := range strings.Split(string(b), "\n") {
			if name, _, _ := strings.Cut(l, ":"); slices.Contains([]string{"Uid", "Gid", "Groups", "CapEff"}, name) {
				creds = append(creds, l)
			}
		}
		dumpable, _ := unix.PrctlRetInt(unix.PR_GET_DUMPABLE, 0, 0, 0, 0)
		return fmt.Sprint(creds, " dumpable ", dumpable)
	}
	before := leader()
	base := t.TempDir()
	for _, dir := range []string{filepath.Dir(base), base} {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mk := func(rel string, mode os.FileMode, content string) string {
		p := filepath.Join(base, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dirMode := func(rel string, mode os.FileMode, gid int) string {
		p := filepath.Join(base, rel)
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, gid); err != nil {
			t.Fatal(err)
		}
		return p
	}
	binary := mk("open/tool", 0o711, "\x7fELF")
	notExec := mk("open/data", 0o644, "\x7fELF")
	script := mk("open/job.sh", 0o711, "#!/bin/sh\n")
	readable := mk("open/ok.sh", 0o755, "#!/bin/sh\n")
	closed := mk("closed/deeper/tool", 0o755, "\x7fELF")
	byGroup := mk("grouped/tool", 0o755, "\x7fELF")
	byACL := mk("acl/tool", 0o755, "\x7fELF")
	closedDir := dirMode("closed", 0o700, 0)
	dirMode("grouped", 0o710, int(id.GID))
	aclDir := dirMode("acl", 0o700, 0)
	if err := unix.Setxattr(aclDir, "system.posix_acl_access", accessACL(id.UID), 0); err != nil {
		t.Skipf("no ACL on this file system: %v", err)
	}
	for _, c := range []struct {
		path, denied, want string
	}{
		{binary, "", ""},
		{readable, "", ""},
		{byGroup, "", ""},
		{byACL, "", ""},
		{notExec, notExec, "make it executable by nobody"},
		{script, script, "make it readable and executable by nobody"},
		{closed, closedDir, "make it searchable by nobody"},
	} {
		err := id.CanRun(c.path)
		if c.denied == "" {
			if err != nil {
				t.Errorf("CanRun(%s): %v, want nil", c.path, err)
			}
			continue
		}
		prefix := "user nobody (uid " + strconv.FormatUint(uint64(id.UID), 10) + ") cannot run " + c.path + ": permission denied on " + c.denied + " ("
		if err == nil || !strings.HasPrefix(err.Error(), prefix) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("CanRun(%s): %v, want %q…%q", c.path, err, prefix, c.want)
		}
	}
	// A FIFO the kind's user put in the command's place is not opened:
	// that would wait for a writer, holding the supervisor's start.
	fifo := filepath.Join(base, "open", "fifo")
	if err := unix.Mkfifo(fifo, 0o777); err != nil {
		t.Fatal(err)
	}
	answered := make(chan error, 1)
	go func() { answered <- id.CanRun(fifo) }()
	select {
	case <-answered:
	case <-time.After(10 * time.Second):
		t.Fatal("CanRun of a FIFO: no answer in 10s")
	}
	// Only the asking threads took nobody's credentials, and none of
	// them serves another goroutine.
	secret := mk("secret", 0o000, "root's")
	errs := make(chan error, 200)
	for range cap(errs) {
		go func() {
			_, err := os.ReadFile(secret)
			errs <- err
		}()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Fatalf("this process after CanRun: %v, want it root still", err)
		}
	}
	var asked sync.WaitGroup
	for range 50 {
		asked.Go(func() {
			for range 4 {
				_ = id.CanRun(binary)
			}
		})
	}
	asked.Wait()
	if after := leader(); after != before {
		t.Errorf("the process after CanRun: %s, want %s", after, before)
	}
}
