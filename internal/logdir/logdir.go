// Package logdir opens the tasks' log files in log_dir so that nobody but
// dama's user and root decides what they are: a supervisor running as
// root appends there what a command prints, and a link planted there, or a
// directory swapped under it, would make it append to any file of root's.
//
// So a log directory is checked, it and every directory above it, and
// opened once for each launch; the log file is opened relative to that
// descriptor, without following a link, and is written only if it is a
// regular file of this user with one name.
package logdir

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dama-etl/dama/protocol"
)

// FileMode is the mode a task's log file is created with: closed to other
// users, open to the log directory's group (log_group).
const FileMode = 0o640

// Dir is a log directory, checked and held open.
type Dir struct {
	path string
	fd   *os.File
}

// Open makes path, the configuration's log_dir, if it is missing, and
// closes it to other users (0750). With group (log_group) the directory is
// that group's, and set-group-ID, so that every log file made in it is the
// group's too.
//
// It refuses a directory that is, or has above it a directory that is,
// another user's than root's or this process's, or that another may write
// to: whoever can rename or write in it can point a task's log anywhere.
// Above it, a directory others may write to is fine if it is sticky (as
// /tmp), where they cannot rename what is not theirs. It refuses a path
// through a symbolic link, which another user may have made where a
// directory was, or may point elsewhere later.
func Open(path, group string) (*Dir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("log_dir %q: %w", path, err)
	}
	if abs == "/" {
		return nil, fmt.Errorf("log_dir %q: want a directory of its own", path)
	}
	// From the root down, each directory is checked before anything is
	// looked up, or made, in it: only root and dama's user can have put
	// there what is found next.
	dir := "/"
	for _, name := range strings.Split(abs[1:], "/") {
		if err := checkParent(dir, path); err != nil {
			return nil, err
		}
		next := filepath.Join(dir, name)
		var st unix.Stat_t
		err := unix.Lstat(next, &st)
		if errors.Is(err, unix.ENOENT) {
			if err = unix.Mkdir(next, 0o750); err == nil || errors.Is(err, unix.EEXIST) {
				err = unix.Lstat(next, &st)
			}
		}
		switch {
		case err != nil:
			return nil, fmt.Errorf("log_dir %s: make or read %s: %w", path, next, err)
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			return nil, fmt.Errorf("log_dir %s: %s is a symbolic link: name the directory it leads to, by a path without links", path, next)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			return nil, fmt.Errorf("log_dir %s: %s is not a directory", path, next)
		}
		dir = next
	}
	d, err := openDir(dir, path)
	if err != nil {
		return nil, err
	}
	if err := d.prepare(group); err != nil {
		d.fd.Close()
		return nil, err
	}
	return d, nil
}

// OpenVolume opens path, a pod's log directory: a volume of dama's
// container alone, whose owner and mode are the kubelet's.
func OpenVolume(path string) (*Dir, error) {
	if err := os.MkdirAll(path, 0o750); err != nil {
		return nil, fmt.Errorf("create the log directory: %w", err)
	}
	return openDir(path, path)
}

func openDir(dir, path string) (*Dir, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the log directory %s: %w", path, err)
	}
	return &Dir{path: path, fd: os.NewFile(uintptr(fd), path)}, nil
}

// foreignOwner says why a file of st is not root's or this process's.
func foreignOwner(st *unix.Stat_t) string {
	if st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Sprintf("belongs to uid %d, not to root or dama's user (uid %d)", st.Uid, os.Geteuid())
	}
	return ""
}

// checkParent checks dir, a directory above the log directory path.
func checkParent(dir, path string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("log_dir %s: read %s: %w", path, dir, err)
	}
	if why := foreignOwner(&st); why != "" {
		return fmt.Errorf("log_dir %s: %s, above it, %s: another user could put any file in the log directory's place", path, dir, why)
	}
	if st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0 {
		return fmt.Errorf("log_dir %s: %s, above it, may be written by other users (mode %o) and is not sticky: one could put any file in the log directory's place", path, dir, st.Mode&0o7777)
	}
	return nil
}

// prepare checks the directory and gives it its group and mode.
func (d *Dir) prepare(group string) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(d.fd.Fd()), &st); err != nil {
		return fmt.Errorf("read the log directory: %w", err)
	}
	if why := foreignOwner(&st); why != "" {
		return fmt.Errorf("log_dir %s %s: that user could make dama write to any file: chown it", d.path, why)
	}
	// Every refusal before any change: a directory refused is left as it
	// was.
	if st.Mode&0o020 != 0 {
		return fmt.Errorf("log_dir %s may be written by its group (mode %o): any of them could make dama write to any file: chmod g-w it", d.path, st.Mode&0o7777)
	}
	mode := st.Mode & 0o7777 &^ 0o007
	if group != "" {
		gid, err := lookupGroup(group)
		if err != nil {
			return err
		}
		mode |= unix.S_ISGID
		if int(st.Gid) != gid {
			if err := unix.Fchown(int(d.fd.Fd()), -1, gid); err != nil {
				return fmt.Errorf("give the log directory %s to group %s: %w", d.path, group, err)
			}
		}
	}
	if mode != st.Mode&0o7777 {
		if err := unix.Fchmod(int(d.fd.Fd()), mode); err != nil {
			return fmt.Errorf("close the log directory %s to other users (mode %o): %w", d.path, st.Mode&0o7777, err)
		}
	}
	return nil
}

// lookupGroup returns the id of group, a name or a number.
func lookupGroup(group string) (int, error) {
	if gid, err := strconv.Atoi(group); err == nil && gid >= 0 {
		return gid, nil
	}
	g, err := user.LookupGroup(group)
	if err != nil {
		return 0, fmt.Errorf("log_group %s: %w", group, err)
	}
	return strconv.Atoi(g.Gid)
}

// Path is the log file of context id, as its readers name it.
func (d *Dir) Path(id int64) string { return protocol.LogPath(d.path, id) }

// Close closes the directory.
func (d *Dir) Close() error { return d.fd.Close() }

// Append opens the log file of context id to append to it, making it if
// it is missing. It refuses anything but a regular file of this user with
// one name.
func (d *Dir) Append(id int64) (*os.File, error) {
	const flags = unix.O_WRONLY | unix.O_APPEND | unix.O_NOFOLLOW | unix.O_NOCTTY | unix.O_CLOEXEC
	name := protocol.LogName(id)
	fd, err := unix.Openat(int(d.fd.Fd()), name, flags|unix.O_CREAT|unix.O_EXCL, FileMode)
	if errors.Is(err, unix.EEXIST) {
		// Not blocking on a FIFO, which is refused below.
		fd, err = unix.Openat(int(d.fd.Fd()), name, flags|unix.O_NONBLOCK, 0)
	}
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("the log file %s is a symbolic link: dama writes no log through a link", d.Path(id))
	case errors.Is(err, unix.ENXIO):
		return nil, fmt.Errorf("the log file %s is not a regular file (a FIFO or a device): dama writes logs to regular files only", d.Path(id))
	case err != nil:
		return nil, fmt.Errorf("open the log file %s: %w", d.Path(id), err)
	}
	f := os.NewFile(uintptr(fd), d.Path(id))
	if err := d.check(f); err != nil {
		f.Close()
		return nil, err
	}
	if err := unix.SetNonblock(int(f.Fd()), false); err != nil {
		f.Close()
		return nil, fmt.Errorf("open the log file %s: %w", d.Path(id), err)
	}
	return f, nil
}

// Reader opens w, a log file Append opened for context id, again, to read
// it: the same file, whatever has been put at its name since.
func (d *Dir) Reader(id int64, w *os.File) (*os.File, error) {
	fd, err := unix.Openat(int(d.fd.Fd()), protocol.LogName(id), unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open the log file %s to read it: %w", d.Path(id), err)
	}
	r := os.NewFile(uintptr(fd), d.Path(id))
	var rs, ws unix.Stat_t
	err = unix.Fstat(fd, &rs)
	if err == nil {
		err = unix.Fstat(int(w.Fd()), &ws)
	}
	switch {
	case err != nil:
		r.Close()
		return nil, fmt.Errorf("read the log file %s: %w", d.Path(id), err)
	case rs.Dev != ws.Dev || rs.Ino != ws.Ino:
		r.Close()
		return nil, fmt.Errorf("the log file %s was replaced since it was opened", d.Path(id))
	}
	return r, nil
}

// check says why f is not a log file dama writes.
func (d *Dir) check(f *os.File) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("read the log file %s: %w", f.Name(), err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("the log file %s is not a regular file (mode %o): dama writes logs to regular files only", f.Name(), st.Mode)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("the log file %s belongs to uid %d, not to dama's user (uid %d)", f.Name(), st.Uid, os.Geteuid())
	case st.Nlink != 1:
		return fmt.Errorf("the log file %s has %d names: dama writes no log that is another file's name too", f.Name(), st.Nlink)
	}
	return nil
}

// OpenLog opens path, which a context names as task id's log, to read it.
// A task may have put anything at its log's path, and its readers (dama
// logs, the status page) read for whoever asks: so only a regular file
// named as dama names logs, opened without following a link and without
// blocking on a FIFO.
func OpenLog(path string, id int64) (*os.File, error) {
	if filepath.Base(path) != protocol.LogName(id) {
		return nil, fmt.Errorf("the log of task %d, %s, is not a dama log", id, path)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("open the log of task %d: %w", id, err)
	}
	if info, err := f.Stat(); err != nil || !info.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("the log of task %d, %s, is not a regular file", id, path)
	}
	return f, nil
}
