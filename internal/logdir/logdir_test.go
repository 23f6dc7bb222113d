package logdir_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dama-etl/dama/internal/logdir"
)

// other is a uid that is neither root nor this process's.
const other = 64123

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
}

func mkdir(t *testing.T, path string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(path, mode); err != nil {
		t.Fatal(err)
	}
	// Chmod after Mkdir: the umask would clear what Mkdir asks.
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, -1); err != nil {
		t.Fatal(err)
	}
}

// A log directory that another user owns or may write to, or that has such
// a directory above it, is refused: that user could put a link where a
// task's log goes, or the directory itself. A sticky directory above it
// (as /tmp) is fine.
func TestOpenRefusesADirectoryAnotherUserControls(t *testing.T) {
	needRoot(t)
	for _, c := range []struct {
		name       string
		parentMode os.FileMode
		parentUID  int
		logsMode   os.FileMode
		logsUID    int
		want       string
	}{
		{name: "another's directory", parentMode: 0o755, logsMode: 0o750, logsUID: other, want: "belongs to uid 64123"},
		{name: "another's directory above", parentMode: 0o755, parentUID: other, logsMode: 0o750, want: "above it, belongs to uid 64123"},
		{name: "writable directory above", parentMode: 0o777, logsMode: 0o750, want: "may be written by other users (mode 777) and is not sticky"},
		{name: "group-writable directory above", parentMode: 0o775, logsMode: 0o750, want: "may be written by other users (mode 775)"},
		{name: "group-writable", parentMode: 0o755, logsMode: 0o770, want: "may be written by its group"},
		{name: "sticky directory above", parentMode: os.ModeSticky | 0o777, logsMode: 0o755},
		{name: "open to others", parentMode: 0o755, logsMode: 0o757},
	} {
		t.Run(c.name, func(t *testing.T) {
			parent := filepath.Join(t.TempDir(), "srv")
			mkdir(t, parent, c.parentMode, c.parentUID)
			logs := filepath.Join(parent, "logs")
			mkdir(t, logs, c.logsMode, c.logsUID)
			d, err := logdir.Open(logs, "")
			if c.want == "" {
				if err != nil {
					t.Fatalf("Open: %v, want it opened", err)
				}
				d.Close()
				if info, err := os.Stat(logs); err != nil || info.Mode().Perm() != 0o750 {
					t.Errorf("the log directory: %v, %v; want it closed to others, 0750", info.Mode(), err)
				}
				return
			}
			if err == nil {
				d.Close()
				t.Fatalf("Open: nil, want %q", c.want)
			}
			if info, err := os.Stat(logs); err != nil || info.Mode().Perm() != c.logsMode.Perm() {
				t.Errorf("the refused directory: %v, %v; want it left as it was, %v", info.Mode(), err, c.logsMode.Perm())
			}
			if !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("Open: %q, want one line saying %q", err, c.want)
			}
		})
	}
}

// Open closes the directory to other users, and the log files are made
// 0640 and appended to.
func TestOpenClosesTheDirectoryAndAppends(t *testing.T) {
	logs := filepath.Join(t.TempDir(), "a", "logs")
	d, err := logdir.Open(logs, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if info, err := os.Stat(logs); err != nil || info.Mode().Perm() != 0o750 {
		t.Fatalf("the log directory: %v, %v; want mode 0750", info.Mode(), err)
	}
	for _, line := range []string{"one\n", "two\n"} {
		f, err := d.Append(7)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		r, err := d.Reader(7, f)
		if err != nil {
			t.Fatal(err)
		}
		r.Close()
		f.Close()
	}
	b, err := os.ReadFile(filepath.Join(logs, "7.log"))
	if err != nil || string(b) != "one\ntwo\n" {
		t.Errorf("7.log: %q, %v; want both lines", b, err)
	}
	if info, err := os.Stat(filepath.Join(logs, "7.log")); err != nil || info.Mode().Perm()&^logdir.FileMode != 0 {
		t.Errorf("7.log: %v, %v; want at most mode %v", info.Mode(), err, os.FileMode(logdir.FileMode))
	}
}

// Whatever is put at a log file's name that is not a regular file of this
// user with one name is not written: a link to another file (which stays
// as it was), another name of a file, a FIFO (without blocking), a
// directory, another user's file.
func TestAppendWritesOnlyALogFile(t *testing.T) {
	dir := t.TempDir()
	logs := filepath.Join(dir, "logs")
	d, err := logdir.Open(logs, "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	target := filepath.Join(dir, "shadow")
	if err := os.WriteFile(target, []byte("root:x:0:0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	plant := map[int64]func(path string) error{
		1: func(path string) error { return os.Symlink(target, path) },
		2: func(path string) error { return os.Link(target, path) },
		3: func(path string) error { return syscall.Mkfifo(path, 0o600) },
		4: func(path string) error { return os.Mkdir(path, 0o700) },
		5: func(path string) error { return os.Symlink("/nonexistent", path) },
	}
	want := map[int64]string{1: "is a symbolic link", 2: "has 2 names", 3: "not a regular file", 4: "is a directory", 5: "is a symbolic link"}
	if os.Geteuid() == 0 {
		plant[6] = func(path string) error {
			if err := os.WriteFile(path, nil, 0o600); err != nil {
				return err
			}
			return os.Chown(path, other, -1)
		}
		want[6] = "belongs to uid 64123"
	}
	for id, fn := range plant {
		if err := fn(filepath.Join(logs, strconv.FormatInt(id, 10)+".log")); err != nil {
			t.Fatal(err)
		}
		f, err := d.Append(id)
		if err == nil {
			f.WriteString("rtpwn::0:0:root:/root:/bin/sh\n")
			f.Close()
			t.Errorf("Append(%d): opened %s, want %q", id, f.Name(), want[id])
		} else if !strings.Contains(err.Error(), want[id]) {
			t.Errorf("Append(%d): %v, want %q", id, err, want[id])
		}
	}
	if b, _ := os.ReadFile(target); string(b) != "root:x:0:0\n" {
		t.Errorf("the file a log was linked to: %q, want it as it was", b)
	}
}

// A log file replaced after it was opened is not read in its place.
func TestReaderReadsTheFileItWasGiven(t *testing.T) {
	dir := t.TempDir()
	d, err := logdir.Open(filepath.Join(dir, "logs"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	f, err := d.Append(9)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	path := filepath.Join(dir, "logs", "9.log")
	if err := os.Rename(path, path+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("another"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r, err := d.Reader(9, f); err == nil {
		r.Close()
		t.Error("Reader: opened the file put in the log's place, want it refused")
	}
}

// A path through a symbolic link is refused, wherever the link is, and
// nothing is made or changed through it: a link that another user put
// where log_dir was (mv logs logs.old; ln -s /etc/logrotate.d logs) would
// have root make its logs, and set its modes, in the link's target.
func TestOpenRefusesAPathThroughALink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "etc")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, path := range map[string]string{
		"log_dir itself":                        filepath.Join(dir, "logs"),
		"a directory above it, to make logs in": filepath.Join(dir, "srv", "new"),
	} {
		link := path
		if filepath.Base(path) == "new" {
			link = filepath.Dir(path)
		}
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		d, err := logdir.Open(path, "")
		if err == nil {
			d.Close()
		}
		if err == nil || !strings.Contains(err.Error(), link+" is a symbolic link") {
			t.Errorf("%s a link: Open: %v, want it refused as a link", name, err)
		}
	}
	if info, err := os.Stat(target); err != nil || info.Mode().Perm() != 0o755 {
		t.Errorf("the links' target: %v, %v; want it as it was, 0755", info.Mode(), err)
	}
	if entries, _ := os.ReadDir(target); len(entries) != 0 {
		t.Errorf("the links' target holds %d entries, want none made through a link", len(entries))
	}
}
