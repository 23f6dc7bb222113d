package etlcontext

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestErrorsAreSortedByWhatCuresThem(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("insert: %w", &pgconn.PgError{Code: code}) }
	for _, c := range []struct {
		name                            string
		err                             error
		unreachable, transient, refused bool
	}{
		{"admin shutdown", pg("57P01"), true, true, false},
		{"starting up", pg("57P03"), true, true, false},
		{"connection failure", pg("08006"), true, true, false},
		{"too many connections", pg("53300"), true, true, false},
		{"disk full", pg("53100"), false, true, false},
		{"statement timeout", pg("57014"), false, true, false},
		{"deadlock", pg("40P01"), false, true, false},
		{"read-only", pg("25006"), false, true, false},
		{"permission denied", pg("42501"), false, false, false},
		{"not null", pg("23502"), false, false, true},
		{"bad text", pg("22021"), false, false, true},
		{"stale run", pg("DMRUN"), false, false, true},
		{"closed mid-read", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true, true, false},
		{"no answer in time", context.DeadlineExceeded, true, true, false},
		{"plain", errors.New("no rows"), false, false, false},
		{"nil", nil, false, false, false},
		{"refused dial", refusedDial(t), true, true, false},
	} {
		if got := Unreachable(c.err); got != c.unreachable {
			t.Errorf("%s: Unreachable = %v, want %v", c.name, got, c.unreachable)
		}
		if got := Transient(c.err); got != c.transient {
			t.Errorf("%s: Transient = %v, want %v", c.name, got, c.transient)
		}
		if got := RequestRefused(ErrCode(c.err)); got != c.refused {
			t.Errorf("%s: Refused = %v, want %v", c.name, got, c.refused)
		}
	}
}

// refusedDial is what pgx gives for a server that is not there: a port of
// this host nothing listens on.
func refusedDial(t *testing.T) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	ln.Close()
	_, err = pgconn.Connect(context.Background(), fmt.Sprintf("postgres://nobody@127.0.0.1:%d/none?connect_timeout=5", addr.Port))
	if err == nil {
		t.Fatal("connected to a closed port")
	}
	return err
}
