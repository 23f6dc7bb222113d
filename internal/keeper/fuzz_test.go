package keeper

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"os"
	"reflect"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// unixPair returns the two ends of a Unix socket pair, whose peers the
// kernel names (SO_PEERCRED) as the handshake needs.
func unixPair(t testing.TB) (a, b net.Conn) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			a = c
		} else {
			b = c
		}
	}
	return a, b
}

var secret = []byte("a supervisor's random secret")

// pipePair returns the two ends of a session whose handshake is done.
func pipePair(t testing.TB) (client, server *stream) {
	a, b := unixPair(t)
	done := make(chan error, 1)
	go func() {
		var err error
		server, err = serverHandshake(b, secret, time.Now().Add(10*time.Second))
		done <- err
	}()
	client, err := clientHandshake(a, secret, time.Now().Add(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return client, server
}

// Before a session's key is checked its message is small: a larger one
// is refused before it is read.
func TestAnOversizedHelloIsRefusedUnread(t *testing.T) {
	client, server := pipePair(t)
	defer client.conn.Close()
	var head [4]byte
	binary.BigEndian.PutUint32(head[:], 1<<30)
	go client.conn.Write(head[:])
	var req request
	if err := server.receive(&req); err == nil {
		t.Fatal("a message of 1 GiB was taken")
	}
	// A message within the bound is taken.
	client2, server2 := pipePair(t)
	defer client2.conn.Close()
	go client2.send(&request{Op: opHello, ContextID: 42, RunKey: "k"})
	if err := server2.receive(&req); err != nil || req.ContextID != 42 {
		t.Fatalf("a hello: %+v, %v", req, err)
	}
}

// FuzzSession gives the keeper arbitrary bytes: as a handshake, which
// never passes without the secret, as the frames of a session's hello,
// none read beyond the hello's bound, and as a statement's packed values,
// which must decode and encode to themselves, NULL apart from empty.
// Nothing panics.
func FuzzSession(f *testing.F) {
	f.Add([]byte("DKP3"), []byte{0, 0, 0, 20, 1, 2, 3}, encoded(values{[]byte("a"), nil, {}}))
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0xff}, []byte{})
	f.Add(append([]byte("DKP3"), make([]byte, 64)...), []byte{0, 0, 0, 0}, []byte(`null`))
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"), []byte{0, 0, 0, 16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, []byte(`"AAAAAQ=="`))
	f.Fuzz(func(t *testing.T, handshake, frames, packed []byte) {
		a, b := unixPair(t)
		go func() {
			a.Write(handshake)
			a.Close()
		}()
		if _, err := serverHandshake(b, secret, time.Now().Add(time.Second)); err == nil {
			t.Fatalf("a handshake of %q passed without the secret", handshake)
		}
		b.Close()

		client, server := pipePair(t)
		go func() {
			client.conn.Write(frames)
			client.conn.Close()
		}()
		for range 4 {
			var req request
			if err := server.receive(&req); err != nil {
				break
			}
		}
		server.conn.Close()

		var v values
		if json.Unmarshal(packed, &v) != nil {
			return
		}
		var again values
		if err := json.Unmarshal(encoded(v), &again); err != nil || !reflect.DeepEqual(again, v) {
			t.Fatalf("%q decodes to %q, which encodes and decodes to %q, %v", packed, v, again, err)
		}
	})
}

// A session whose key was not taken yet is refused every request but its
// lock, before the keeper does anything for it.
func TestAnUnverifiedSessionIsRefusedAllButItsLock(t *testing.T) {
	sess := &session{s: &server{}, contextID: 42, runKey: "k", channels: make(map[string]bool)}
	for o := opHello; o <= opPing; o++ {
		if o == opHello || o == opLock {
			continue
		}
		r := sess.handle(context.Background(), &request{Op: o, SQL: "SELECT 1", Channel: "c", Depth: 1})
		if r.Err == nil || r.Err.Kind != errRefused {
			t.Errorf("request %d before the lock: %+v, want refused", o, r.Err)
		}
	}
}
