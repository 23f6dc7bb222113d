package keeper

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// A keeper and a task process talk over a Unix socket that any process of
// their user may open, or replace: a task's command runs as that user. So
// each proves to the other that it knows a secret derived from the
// database URL, which a command does not get, before anything else is
// said, and every message after is sealed (AES-256-GCM, a key per
// direction derived from the secret and both sides' nonces, numbered): a
// process that poses as the keeper, or relays between the two, learns no
// run key and changes no statement.

// Secret is the secret a keeper and its task processes share: derived
// from what they connect to the database with (the URL, and whatever else
// the caller adds), which their user's other processes do not know.
func Secret(material []byte) []byte {
	m := hmac.New(sha256.New, material)
	m.Write([]byte("dama lock keeper v1"))
	return m.Sum(nil)
}

// handshakeMagic opens a client's handshake.
var handshakeMagic = []byte("DKP2")

const nonceSize = 32

func mac(secret []byte, parts ...[]byte) []byte {
	m := hmac.New(sha256.New, secret)
	for _, p := range parts {
		m.Write(p)
	}
	return m.Sum(nil)
}

// ErrHandshake is what a connection fails with when the other side does
// not prove it knows the secret.
var ErrHandshake = errors.New("the other side of the keeper's socket does not know the database's secret")

// clientHandshake proves the secret to the keeper on conn, and checks the
// keeper's proof, before anything is sent.
func clientHandshake(conn net.Conn, secret []byte, deadline time.Time) (*stream, error) {
	conn.SetDeadline(deadline)
	defer conn.SetDeadline(time.Time{})
	nc := make([]byte, nonceSize)
	rand.Read(nc)
	if _, err := conn.Write(append(append([]byte{}, handshakeMagic...), nc...)); err != nil {
		return nil, err
	}
	in := make([]byte, nonceSize+sha256.Size)
	if _, err := io.ReadFull(conn, in); err != nil {
		return nil, err
	}
	ns, proof := in[:nonceSize], in[nonceSize:]
	if !hmac.Equal(proof, mac(secret, []byte("keeper"), nc, ns)) {
		return nil, ErrHandshake
	}
	if _, err := conn.Write(mac(secret, []byte("task"), nc, ns)); err != nil {
		return nil, err
	}
	return newStream(conn, secret, nc, ns, true, maxMessage)
}

// serverHandshake checks a task process's proof of the secret on conn and
// gives the keeper's.
func serverHandshake(conn net.Conn, secret []byte, deadline time.Time) (*stream, error) {
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
	if _, err := conn.Write(append(ns, mac(secret, []byte("keeper"), nc, ns)...)); err != nil {
		return nil, err
	}
	proof := make([]byte, sha256.Size)
	if _, err := io.ReadFull(conn, proof); err != nil {
		return nil, err
	}
	if !hmac.Equal(proof, mac(secret, []byte("task"), nc, ns)) {
		return nil, ErrHandshake
	}
	return newStream(conn, secret, nc, ns, false, maxHello)
}

// stream carries sealed messages over a connection: each a frame of its
// own (its length, then the sealed encoding of one message, codec.go), whose
// length is checked before it is read, decoded alone.
type stream struct {
	conn  net.Conn
	r     *bufio.Reader
	open  cipher.AEAD
	inSeq uint64
	limit atomic.Int64

	mu     sync.Mutex
	seal   cipher.AEAD
	outSeq uint64
	bw     *bufio.Writer
	buf    []byte
}

func newStream(conn net.Conn, secret, nc, ns []byte, client bool, limit int) (*stream, error) {
	aead := func(label string) (cipher.AEAD, error) {
		block, err := aes.NewCipher(mac(secret, []byte(label), nc, ns))
		if err != nil {
			return nil, err
		}
		return cipher.NewGCM(block)
	}
	toKeeper, err := aead("to keeper")
	if err != nil {
		return nil, err
	}
	toTask, err := aead("to task")
	if err != nil {
		return nil, err
	}
	s := &stream{conn: conn, r: bufio.NewReader(conn), bw: bufio.NewWriter(conn), open: toKeeper, seal: toTask}
	if client {
		s.open, s.seal = toTask, toKeeper
	}
	s.limit.Store(int64(limit))
	return s, nil
}

// setLimit changes the largest message read from now on.
func (s *stream) setLimit(n int) { s.limit.Store(int64(n)) }

func seqNonce(seq uint64) []byte {
	nonce := make([]byte, 12)
	binary.BigEndian.PutUint64(nonce[4:], seq)
	return nonce
}

// keptBuffer is the largest send buffer a stream keeps for its next
// message: a statement's usual size, not its largest.
const keptBuffer = 64 << 10

func (s *stream) send(m message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := encoder{b: s.buf[:0]}
	m.encode(&e)
	var head [4]byte
	binary.BigEndian.PutUint32(head[:], uint32(len(e.b)+s.seal.Overhead()))
	sealed := s.seal.Seal(e.b[:0], seqNonce(s.outSeq), e.b, head[:])
	if cap(sealed) <= keptBuffer {
		s.buf = sealed
	}
	s.outSeq++
	s.bw.Write(head[:])
	s.bw.Write(sealed)
	return s.bw.Flush()
}

// receive reads the next message into m; one goroutine at a time. What m
// holds of bytes is the message's own, never reused.
func (s *stream) receive(m message) error {
	var head [4]byte
	if _, err := io.ReadFull(s.r, head[:]); err != nil {
		return err
	}
	n := int64(binary.BigEndian.Uint32(head[:]))
	if n < int64(s.open.Overhead()) || n > s.limit.Load()+int64(s.open.Overhead()) {
		return fmt.Errorf("a message of %d bytes: at most %d are taken", n, s.limit.Load())
	}
	sealed := make([]byte, n)
	if _, err := io.ReadFull(s.r, sealed); err != nil {
		return err
	}
	body, err := s.open.Open(sealed[:0], seqNonce(s.inSeq), sealed, head[:])
	if err != nil {
		return fmt.Errorf("a message that was not sealed by the other side: %w", err)
	}
	s.inSeq++
	d := decoder{b: body}
	m.decode(&d)
	return d.end()
}
