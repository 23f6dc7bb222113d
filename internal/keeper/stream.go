package keeper

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A keeper and its task processes talk over a Unix socket in a directory
// closed to other users (Dir), and the keeper refuses a peer of another
// uid (SO_PEERCRED): the kernel keeps other users out. A command of the
// task processes' own user may still open the socket, or put one of its
// own in the keeper's place. So before anything else is said each side
// proves to the other that it knows a random secret, which their
// supervisor made and handed them on a socket read once they were
// non-dumpable (protocol.Secrets.Keeper), and which no command gets: an
// HMAC-SHA256 of both sides' nonces and of the two processes' pids as
// the kernel reports them (SO_PEERCRED). A proof is thus good for one
// pair of processes only: one that relays between a task process and its
// keeper finds its own pid in each proof where the other side expects
// its peer's. Nothing after needs sealing: the kernel carries a Unix
// socket's bytes from one process to the other, and no third process of
// the user can read them, or take either end, from a non-dumpable
// process.

// handshakeMagic opens a client's handshake.
var handshakeMagic = []byte("DKP3")

const nonceSize = 32

// proof is one side's proof of the secret for the session between the
// keeper of pid keeper and the task process of pid task.
func proof(secret []byte, side string, nc, ns []byte, keeper, task int32) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(side))
	m.Write(nc)
	m.Write(ns)
	binary.Write(m, binary.BigEndian, [2]int32{keeper, task})
	return m.Sum(nil)
}

// ErrHandshake is what a connection fails with when the other side does
// not prove it knows the secret.
var ErrHandshake = errors.New("the other side of the keeper's socket does not know its supervisor's secret")

// peerCred returns the credentials of the process at the other end of
// conn, as the kernel saw it when it connected (or listened).
func peerCred(conn net.Conn) (*unix.Ucred, error) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("a %T is no Unix socket", conn)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var (
		cred *unix.Ucred
		cerr error
	)
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("read the peer's credentials: %w", cerr)
	}
	return cred, nil
}

// clientHandshake proves the secret to the keeper on conn, and checks the
// keeper's proof, before anything is sent.
func clientHandshake(conn net.Conn, secret []byte, deadline time.Time) (*stream, error) {
	peer, err := peerCred(conn)
	if err != nil {
		return nil, err
	}
	keeper, task := peer.Pid, int32(os.Getpid())
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	nc := make([]byte, nonceSize)
	rand.Read(nc)
	if _, err := conn.Write(append(bytes.Clone(handshakeMagic), nc...)); err != nil {
		return nil, err
	}
	in := make([]byte, nonceSize+sha256.Size)
	if _, err := io.ReadFull(conn, in); err != nil {
		return nil, err
	}
	ns, got := in[:nonceSize], in[nonceSize:]
	if !hmac.Equal(got, proof(secret, "keeper", nc, ns, keeper, task)) {
		return nil, ErrHandshake
	}
	if _, err := conn.Write(proof(secret, "task", nc, ns, keeper, task)); err != nil {
		return nil, err
	}
	return newStream(conn, maxMessage), nil
}

// serverHandshake checks a task process's proof of the secret on conn and
// gives the keeper's.
func serverHandshake(conn net.Conn, secret []byte, deadline time.Time) (*stream, error) {
	peer, err := peerCred(conn)
	if err != nil {
		return nil, err
	}
	task, keeper := peer.Pid, int32(os.Getpid())
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	in := make([]byte, len(handshakeMagic)+nonceSize)
	if _, err := io.ReadFull(conn, in); err != nil {
		return nil, err
	}
	if !bytes.Equal(in[:len(handshakeMagic)], handshakeMagic) {
		return nil, fmt.Errorf("%w: not a task process's handshake", ErrHandshake)
	}
	nc := in[len(handshakeMagic):]
	ns := make([]byte, nonceSize)
	rand.Read(ns)
	if _, err := conn.Write(append(ns, proof(secret, "keeper", nc, ns, keeper, task)...)); err != nil {
		return nil, err
	}
	got := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, got); err != nil {
		return nil, err
	}
	if !hmac.Equal(got, proof(secret, "task", nc, ns, keeper, task)) {
		return nil, ErrHandshake
	}
	return newStream(conn, maxHello), nil
}

// stream carries messages over a connection: each a frame of its own, its
// length then the message in JSON, whose length is checked before it is
// read. json.Unmarshal checks the whole frame before it decodes anything,
// and refuses what is left over and values out of their field's range.
type stream struct {
	conn net.Conn
	r    *bufio.Reader
	// limit bounds the messages read and sent, and changes once a
	// session's hello is taken.
	limit atomic.Int64
	mu    sync.Mutex // one frame written at a time
}

func newStream(conn net.Conn, limit int) *stream {
	s := &stream{conn: conn, r: bufio.NewReader(conn)}
	s.limit.Store(int64(limit))
	return s
}

// errTooLarge is what sending a message larger than the stream's limit
// (maxHello until a session's hello is taken, then Config.MaxMessage)
// fails with, before anything of it is sent: the other side would end
// the session.
var errTooLarge = errors.New("a message larger than the lock keeper's protocol takes")

func (s *stream) send(m any) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if limit := s.limit.Load(); int64(len(b)) > limit {
		return fmt.Errorf("%w: %d bytes, at most %d", errTooLarge, len(b), limit)
	}
	frame := net.Buffers{binary.BigEndian.AppendUint32(nil, uint32(len(b))), b}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, err = frame.WriteTo(s.conn)
	return err
}

// receive reads the next message into m; one goroutine at a time.
func (s *stream) receive(m any) error {
	var head [4]byte
	if _, err := io.ReadFull(s.r, head[:]); err != nil {
		return err
	}
	n := int64(binary.BigEndian.Uint32(head[:]))
	if n > s.limit.Load() {
		return fmt.Errorf("a message of %d bytes: at most %d are taken", n, s.limit.Load())
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(s.r, body); err != nil {
		return err
	}
	return json.Unmarshal(body, m)
}
