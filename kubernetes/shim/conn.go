package shim

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// In a pod, a task runs in two containers (see docs/kubernetes.md): the
// task process in dama's, which alone holds the database's secrets and the
// lock, and the kind's command in the user's, under dama's shim
// (cmd/dama-shim), its first process. The shim knows nothing of the
// database: it connects to the task process's socket on a volume the two
// containers share, and does what it is told there (Request): find
// the command, start it with the task process's events and output pipes
// (passed on the socket), signal it. It tells what happened
// (Reply), and when the task process is gone, it stops the command.
// The socket takes one connection, the shim's: the command starts only
// after it, and the task process removes the socket once connected.

// Request is a message from the task process to its shim: exactly one
// of its fields is set.
type Request struct {
	// Find asks whether the command's program (its argv[0]) is found and
	// executable in the shim's container, as exec.LookPath finds it.
	Find string `json:"find,omitempty"`
	// Start starts the command; the message carries the write ends of
	// the events pipe and of the output's, then their read ends, which the
	// shim drains once the task process is gone: a command that writes
	// while it stops then neither dies of SIGPIPE nor blocks (Start).
	Start *Start `json:"start,omitempty"`
	// Signal is sent to the command's processes: SIGTERM or SIGKILL.
	Signal syscall.Signal `json:"signal,omitempty"`
}

// Start is how the shim starts the command: Argv with the shim's
// environment, Env set over it, the events pipe on protocol.EventsFD, its
// output on stdout and stderr, stdin on /dev/null, in a process group of
// its own.
type Start struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	// KillGrace is how long the shim waits, when the task process is
	// gone, between SIGTERM and SIGKILL to the command.
	KillGrace time.Duration `json:"kill_grace"`
}

// Reply is a message from the shim to its task process.
type Reply struct {
	// Found answers Find: the path of the program.
	Found string `json:"found,omitempty"`
	// Started answers Start: the command's pid, in the shim's container.
	Started int `json:"started,omitempty"`
	// Error answers a Find or a Start that failed.
	Error string `json:"error,omitempty"`
	// Exited says the command exited, and every process of the shim's
	// container is gone.
	Exited *Exit `json:"exited,omitempty"`
}

// Exit is how the command ended.
type Exit struct {
	// Status is its wait status (syscall.WaitStatus).
	Status uint32 `json:"status"`
	// OOMKills is how many processes the kernel killed for want of
	// memory in the container while the command ran.
	OOMKills int `json:"oom_kills,omitempty"`
}

// Socket is the name of the task process's socket in the volume it
// shares with the shim; SocketFlag names its path on the task process's
// command line, after its launch's arguments (protocol.Launch.Args).
const (
	Socket     = "shim.sock"
	SocketFlag = "--shim-socket"
)

// maxMessage bounds a message: a Start carries the arguments and the
// checkpoint (protocol.MaxEnvPayload each) in its environment.
const maxMessage = 1 << 20

// Conn is one end of the socket between a task process and its shim.
// Its methods are not safe for concurrent use but for one reader beside
// one writer.
type Conn struct {
	c *net.UnixConn
	// buf holds what was read and not yet returned; fds, the descriptors
	// that came with it.
	buf []byte
	fds []int
}

// NewConn wraps c.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c} }

// Close closes the connection and any descriptor received and not taken.
func (s *Conn) Close() error {
	for _, fd := range s.fds {
		unix.Close(fd)
	}
	s.fds = nil
	return s.c.Close()
}

// Send writes msg, with files passed alongside.
func (s *Conn) Send(msg any, files ...int) error {
	body, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("encode a message to the shim: %w", err)
	}
	frame := binary.BigEndian.AppendUint32(make([]byte, 0, 4+len(body)), uint32(len(body)))
	frame = append(frame, body...)
	var oob []byte
	if len(files) > 0 {
		oob = unix.UnixRights(files...)
	}
	// The descriptors go with the first bytes; the rest, if the socket
	// took only part, follows.
	n, _, err := s.c.WriteMsgUnix(frame, oob, nil)
	if err == nil && n < len(frame) {
		_, err = s.c.Write(frame[n:])
	}
	if err != nil {
		return fmt.Errorf("write to the shim's socket: %w", err)
	}
	return nil
}

// Receive reads the next message into msg, and returns the descriptors
// that came with it (the receiver owns them). It returns io.EOF when the
// other end closed between messages.
func (s *Conn) Receive(msg any) ([]int, error) {
	for len(s.buf) < 4 || len(s.buf) < 4+int(binary.BigEndian.Uint32(s.buf)) {
		if len(s.buf) >= 4 && binary.BigEndian.Uint32(s.buf) > maxMessage {
			return nil, fmt.Errorf("a message on the shim's socket of %d bytes, over %d", binary.BigEndian.Uint32(s.buf), maxMessage)
		}
		if err := s.fill(); err != nil {
			if errors.Is(err, io.EOF) && len(s.buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	n := 4 + int(binary.BigEndian.Uint32(s.buf))
	body := s.buf[4:n]
	err := json.Unmarshal(body, msg)
	s.buf = s.buf[n:]
	fds := s.fds
	s.fds = nil
	if err != nil {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("decode a message on the shim's socket: %w", err)
	}
	return fds, nil
}

func (s *Conn) fill() error {
	var b [64 << 10]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := s.c.ReadMsgUnix(b[:], oob)
	if oobn > 0 {
		cmsgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		for _, m := range cmsgs {
			if fds, err := unix.ParseUnixRights(&m); err == nil {
				for _, fd := range fds {
					unix.CloseOnExec(fd)
				}
				s.fds = append(s.fds, fds...)
			}
		}
		if perr != nil {
			return fmt.Errorf("read descriptors from the shim's socket: %w", perr)
		}
	}
	if n > 0 {
		s.buf = append(s.buf, b[:n]...)
	}
	switch {
	case err != nil:
		return err
	case n <= 0:
		return io.EOF
	}
	return nil
}
