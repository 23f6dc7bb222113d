package keeper

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// lockSocket takes socket's lock file, one keeper per socket, and writes
// the keeper's pid in it; it fails with ErrRunning when another keeper
// holds it. It returns the file, held, and its identity.
func lockSocket(socket string) (*os.File, *[2]uint64, error) {
	lockFile, err := os.OpenFile(socket+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open the keeper's lock file: %w", err)
	}
	fail := func(err error) (*os.File, *[2]uint64, error) {
		lockFile.Close()
		return nil, nil, err
	}
	if err := unix.Flock(int(lockFile.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if errors.Is(err, unix.EWOULDBLOCK) {
			return fail(ErrRunning)
		}
		return fail(fmt.Errorf("lock the keeper's lock file: %w", err))
	}
	// A keeper that exits idle removes its lock file, holding it: one that
	// opened the file before and locked it after holds a file no longer
	// at the path, and leaves the socket to the keeper of the new one.
	var held unix.Stat_t
	if err := unix.Fstat(int(lockFile.Fd()), &held); err != nil {
		return fail(fmt.Errorf("read the keeper's lock file: %w", err))
	}
	lockID := &[2]uint64{held.Dev, held.Ino}
	if id := fileID(socket + ".lock"); id == nil || *id != *lockID {
		return fail(ErrRunning)
	}
	// The pid, for an operator (and a test) to find the keeper by.
	if err := lockFile.Truncate(0); err == nil {
		lockFile.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return lockFile, lockID, nil
}

// listenSocket listens on socket, under its lock (lockSocket), and
// returns the listener and the identity of the socket's file.
func listenSocket(socket string) (*net.UnixListener, *[2]uint64, error) {
	// Under the lock, a socket left behind is a dead keeper's.
	if err := os.Remove(socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("remove the socket of a keeper that ended: %w", err)
	}
	var ln *net.UnixListener
	if err := viaDir(socket, func(addr string) (err error) {
		ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: addr, Net: "unix"})
		return err
	}); err != nil {
		return nil, nil, fmt.Errorf("listen on the keeper's socket: %w", err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, fileID(socket), nil
}

// checkPeer refuses a process of another user: the socket's directory
// keeps them out already, unless an operator opened it.
func checkPeer(conn *net.UnixConn) error {
	cred, err := peerCred(conn)
	if err != nil {
		return err
	}
	if int(cred.Uid) != os.Getuid() {
		return fmt.Errorf("a process of uid %d: the keeper serves uid %d only", cred.Uid, os.Getuid())
	}
	return nil
}

// fileID names the file at path by its device and inode; nil when there
// is none.
func fileID(path string) *[2]uint64 {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return nil
	}
	return &[2]uint64{st.Dev, st.Ino}
}

// Dir makes dir, the directory of a keeper's socket, if it is missing, and
// checks that it belongs to this user and is closed to others.
func Dir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make the keeper's directory: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("read the keeper's directory: %w", err)
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is not a directory", dir)
	case int(st.Uid) != os.Getuid():
		return fmt.Errorf("%s belongs to uid %d, not to this user (%d)", dir, st.Uid, os.Getuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("%s is open to other users (mode %o): want 0700", dir, st.Mode&0o777)
	}
	return nil
}

// SocketPath is the socket of the keeper of the given directory and name.
func SocketPath(dir, name string) string { return filepath.Join(dir, name+".sock") }

// viaDir calls fn with an address of socket short enough for a socket's
// (108 bytes, where a log directory's path may not fit): the socket's
// name in its directory, reached through a descriptor of the directory.
func viaDir(socket string, fn func(addr string) error) error {
	fd, err := unix.Open(filepath.Dir(socket), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open the directory of the keeper's socket: %w", err)
	}
	defer unix.Close(fd)
	return fn(fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(socket)))
}
