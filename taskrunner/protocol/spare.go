package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A supervisor keeps a task process started ahead of its launch, a spare:
// the program's start (its exec and initialization, milliseconds for a
// program of dama's size) and its connections are then not between a
// task's submission and its lock. A spare is started with
// `taskrunner --spare-fd 4 --ready-fd 3 --lock-mode M` (Launch.SpareFD).
// Descriptor 4 is one end of a SOCK_SEQPACKET socket pair whose other end
// only its supervisor holds, on which, in order:
//
//  1. the spare, once it is non-dumpable, sends one byte (SendHello);
//  2. the supervisor, once it saw no tracer attached to the spare, sends
//     its Secrets, with the key of the run the spare will be, made before
//     the run (SendSecrets): neither /proc/<pid>/fd nor a tracer can read
//     them there, as they could a pipe in the spare's first milliseconds;
//  3. the spare connects as a runner of lock mode M would, and the
//     supervisor, when it has a task for it, sends the launch and the
//     task's log file, which it opens as it opens a runner's (SendLaunch).
//
// The end of the socket before the secrets or the launch (the supervisor
// stopped, or died) tells the spare to exit unused (ErrNoLaunch).

// SpareFD is the descriptor a supervisor hands a spare, after the ready
// pipe.
const SpareFD = 4

// ErrNoLaunch is returned by ReceiveSecrets and ReceiveLaunch when the
// supervisor closed the socket without them: the spare exits, unused.
var ErrNoLaunch = errors.New("the supervisor closed the spare's socket without a launch")

// SendHello tells the supervisor, on the spare's socket fd, that the spare
// is non-dumpable: what it is sent from now on is its own.
func SendHello(fd int) error {
	for {
		err := unix.Sendmsg(fd, []byte{1}, nil, nil, unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("greet the supervisor: %w", err)
		}
		return nil
	}
}

// AwaitHello waits, until deadline, for the hello of the spare whose
// socket is conn.
func AwaitHello(conn *os.File, deadline time.Time) error {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return fmt.Errorf("wait for a spare's hello: %w", err)
	}
	defer conn.SetReadDeadline(time.Time{})
	var b [2]byte
	n, err := conn.Read(b[:])
	switch {
	case err != nil:
		return fmt.Errorf("wait for a spare's hello: %w", err)
	case n != 1 || b[0] != 1:
		return fmt.Errorf("wait for a spare's hello: %d bytes", n)
	}
	return nil
}

// SendSecrets sends the spare whose socket is conn its secrets, with
// the key of the run it will be.
func SendSecrets(conn *os.File, secrets Secrets) error {
	if err := checkRunKey(secrets.RunKey); err != nil {
		return err
	}
	msg, err := secrets.encode()
	if err != nil {
		return err
	}
	if err := sendmsg(conn, msg, nil); err != nil {
		return fmt.Errorf("hand a spare its secrets: %w", err)
	}
	return nil
}

// ReceiveSecrets waits on fd, a spare's socket, for its secrets, with the
// key of the run it will be; ErrNoLaunch when the socket was closed with
// none.
func ReceiveSecrets(fd int) (Secrets, error) {
	msg, files, err := recvmsg(fd, MaxSecrets, unix.CmsgSpace(4*4))
	for _, f := range files {
		f.Close()
	}
	switch {
	case errors.Is(err, ErrNoLaunch):
		return Secrets{}, err
	case err != nil:
		return Secrets{}, fmt.Errorf("receive the secrets: %w", err)
	case len(files) > 0:
		return Secrets{}, errors.New("receive the secrets: a message with descriptors")
	}
	secrets, err := parseSecrets(msg)
	if err != nil {
		return Secrets{}, err
	}
	if err := checkRunKey(secrets.RunKey); err != nil {
		return Secrets{}, err
	}
	return secrets, nil
}

// checkRunKey checks a spare's run key: 64 lower-case hexadecimal digits
// (etlcontext.NewRunKey).
func checkRunKey(key string) error {
	if len(key) != 64 || strings.Trim(key, "0123456789abcdef") != "" {
		return fmt.Errorf("a spare's key: want 64 hexadecimal digits, got %d bytes", len(key))
	}
	return nil
}

// MaxSpareLaunch bounds a spare's launch message.
const MaxSpareLaunch = 4 << 10

// spareLaunch is a launch message.
type spareLaunch struct {
	ContextID int64    `json:"context_id"`
	RunID     string   `json:"run_id"`
	LockMode  LockMode `json:"lock_mode"`
}

// SendLaunch hands launch l and the task's log file to the spare whose
// socket is conn, in one message. Only ContextID, RunID and LockMode are
// taken from l: the spare's descriptors are its own.
func SendLaunch(conn *os.File, l Launch, log *os.File) error {
	msg, err := json.Marshal(spareLaunch{ContextID: l.ContextID, RunID: l.RunID, LockMode: l.LockMode})
	if err != nil {
		return fmt.Errorf("encode a spare's launch: %w", err)
	}
	if len(msg) > MaxSpareLaunch {
		return fmt.Errorf("a spare's launch is %d bytes, over %d", len(msg), MaxSpareLaunch)
	}
	if err := sendmsg(conn, msg, unix.UnixRights(int(log.Fd()))); err != nil {
		return fmt.Errorf("hand a spare its launch: %w", err)
	}
	return nil
}

// sendmsg sends one message on conn, with oob's control data.
func sendmsg(conn *os.File, msg, oob []byte) error {
	rc, err := conn.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Write(func(fd uintptr) bool {
		serr = unix.Sendmsg(int(fd), msg, oob, nil, unix.MSG_NOSIGNAL)
		return serr != unix.EAGAIN
	})
	if err == nil {
		err = serr
	}
	return err
}

// ReceiveLaunch waits on fd, a spare's socket (Launch.SpareFD), for its
// launch, and returns it with the task's log file. The launch's
// descriptors are left 0: the caller keeps its own. It returns ErrNoLaunch
// when the socket was closed with none.
func ReceiveLaunch(fd int) (Launch, *os.File, error) {
	msg, files, err := recvmsg(fd, MaxSpareLaunch, unix.CmsgSpace(4*4))
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	switch {
	case errors.Is(err, ErrNoLaunch):
		return Launch{}, nil, err
	case err != nil:
		closeAll()
		return Launch{}, nil, fmt.Errorf("receive the launch: %w", err)
	case len(files) != 1:
		closeAll()
		return Launch{}, nil, fmt.Errorf("receive the launch: %d descriptors, want the log file alone", len(files))
	}
	l, err := ParseSpareLaunch(msg)
	if err != nil {
		closeAll()
		return Launch{}, nil, err
	}
	return l, files[0], nil
}

// recvmsg waits on fd for one message of at most max bytes, with room
// for oobSize bytes of control data, and returns it with the descriptors
// it passed (close-on-exec); ErrNoLaunch at the socket's end.
func recvmsg(fd, max, oobSize int) ([]byte, []*os.File, error) {
	buf := make([]byte, max+1)
	oob := make([]byte, oobSize)
	var (
		n, oobn, flags int
		err            error
	)
	for {
		n, oobn, flags, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, nil, err
	}
	files, ferr := receivedFiles(oob[:oobn])
	switch {
	case ferr != nil:
		return nil, files, ferr
	case n == 0 && len(files) == 0:
		return nil, nil, ErrNoLaunch
	case flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > max:
		return nil, files, fmt.Errorf("a message over %d bytes, or with too many descriptors", max)
	}
	return buf[:n], files, nil
}

// receivedFiles returns the descriptors passed in a message's control
// data.
func receivedFiles(oob []byte) ([]*os.File, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "log"))
		}
	}
	return files, nil
}

// ParseSpareLaunch reads a spare's launch message: a launch as ParseLaunch
// accepts one.
func ParseSpareLaunch(msg []byte) (Launch, error) {
	var m spareLaunch
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Launch{}, fmt.Errorf("a spare's launch: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Launch{}, errors.New("a spare's launch: data after the message")
	}
	l := Launch{ContextID: m.ContextID, RunID: m.RunID, LockMode: m.LockMode}
	if err := l.validate(); err != nil {
		return Launch{}, fmt.Errorf("a spare's launch: %w", err)
	}
	return l, nil
}
