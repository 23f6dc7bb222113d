package testenv

import (
	"net"
	"strings"
	"testing"
	"time"
)

// Only the started process is heard on its readiness socket: another
// process (here the test's own), which finds the socket's path in
// /proc/net/unix, is not.
func TestReadinessComesFromTheProcessOnly(t *testing.T) {
	e := &Env{T: t, Dir: t.TempDir(), URL: "postgres://nowhere/" + randomHex(4)}
	p := e.StartProgram("/bin/sleep", "", "60")
	var socket string
	for _, kv := range p.Cmd.Env {
		if v, ok := strings.CutPrefix(kv, "NOTIFY_SOCKET="); ok {
			socket = v
		}
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("READY=1")); err != nil {
		t.Fatal(err)
	}
	if !Holds(500*time.Millisecond, func() bool {
		select {
		case <-p.Ready():
			return false
		default:
			return true
		}
	}) {
		t.Fatal("READY=1 from another process than the one started counted")
	}
}
