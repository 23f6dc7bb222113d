package shim

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"reflect"
	"syscall"
	"testing"
)

// shimPair returns the two ends of a socket like a task process's and its
// shim's.
func shimPair(t testing.TB) (*Conn, *Conn) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var ends [2]*Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "shim")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ends[i] = NewConn(c.(*net.UnixConn))
	}
	t.Cleanup(func() { ends[0].Close(); ends[1].Close() })
	return ends[0], ends[1]
}

func TestShimConnPassesMessagesAndDescriptors(t *testing.T) {
	holder, shim := shimPair(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	big := make([]byte, 300<<10) // over a socket buffer's share of a write
	for i := range big {
		big[i] = 'a' + byte(i%26)
	}
	sent := Request{Start: &Start{Argv: []string{"/bin/true"}, Env: []string{"DAMA_ARGS=" + string(big)}, KillGrace: 7}}
	done := make(chan error, 1)
	go func() { done <- holder.Send(sent, int(w.Fd()), int(r.Fd())) }()
	var got Request
	fds, err := shim.Receive(&got)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, sent) {
		t.Errorf("received %+v, want what was sent", got.Start.Argv)
	}
	if len(fds) != 2 {
		t.Fatalf("received %d descriptors, want 2", len(fds))
	}
	// The descriptor received is the pipe's write end.
	passed := os.NewFile(uintptr(fds[0]), "passed")
	defer passed.Close()
	syscall.Close(fds[1])
	if _, err := passed.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	var b [1]byte
	if _, err := r.Read(b[:]); err != nil || b[0] != 'x' {
		t.Errorf("read %q, %v through the passed descriptor", b, err)
	}
	holder.Close()
	if _, err := shim.Receive(&got); !errors.Is(err, io.EOF) {
		t.Errorf("after the other end closed: %v, want EOF", err)
	}
}

// FuzzReceive: whatever bytes come on the socket, Receive returns a
// message or an error, never more than was sent, and what it decodes
// goes back and forth unchanged.
func FuzzReceive(f *testing.F) {
	frame := func(s string) []byte {
		return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
	}
	for _, m := range [][]byte{
		frame(`{"find":"python3"}`),
		frame(`{"start":{"argv":["/bin/sh","-c","exit 3"],"env":["DAMA_ARGS={}"],"kill_grace":1000000000}}`),
		append(frame(`{"signal":15}`), frame(`{"exited":{"status":768,"oom_kills":1}}`)...),
		frame(`{"started":12}`),
		frame(`{"find":`),
		{0xff, 0xff, 0xff, 0xff, '{'},
		{0, 0},
		{},
	} {
		f.Add(m)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		a, b := shimPair(t)
		go func() {
			_, _ = a.c.Write(in)
			a.c.CloseWrite()
		}()
		for range 8 {
			var req Request
			if _, err := b.Receive(&req); err != nil {
				return
			}
			c, d := shimPair(t)
			if err := c.Send(req); err != nil {
				t.Fatalf("%+v does not encode again: %v", req, err)
			}
			var again Request
			if _, err := d.Receive(&again); err != nil || !reflect.DeepEqual(again, req) {
				t.Fatalf("%+v came back as %+v, %v", req, again, err)
			}
		}
	})
}
