package damacli

import (
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// checkOneLine fails when err's message could not be the single line on
// stderr that every dama error is.
func checkOneLine(t *testing.T, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" || strings.ContainsAny(msg, "\n\r") {
		t.Fatalf("error %q: want one non-empty line", msg)
	}
}

func FuzzDueAt(f *testing.F) {
	for _, s := range []struct {
		runAt string
		delay time.Duration
	}{
		{"", 0},
		{"", time.Hour},
		{"", -time.Second},
		{"", 1<<63 - 1},
		{"2026-11-22T18:00:00Z", 0},
		{"2026-11-23T02:00:00+01:00", 0},
		{"2026-11-22T18:00:00.123456789-07:30", 0},
		{"2026-11-22T18:00:00Z", time.Minute},
		{"0001-01-01T00:00:00Z", 0},
		{"9999-12-31T23:59:59.999999999+23:59", 0},
		{"0000-01-01T00:00:00-23:59", 0},
		{"2026-11-22 18:00:00", 0},
		{"2026-11-22T18:00:00", 0},
		{"2026-02-30T18:00:00Z", 0},
		{"2026-11-22T24:00:00Z", 0},
		{"2026-11-22T18:00:00+24:00", 0},
		{"2026-11-22t18:00:00z", 0},
		{"tomorrow\nnoon", 0},
		{"1h", 0},
	} {
		f.Add(s.runAt, int64(s.delay))
	}
	// A fixed clock, so that a failing input replays the same way.
	fuzzNow := time.Date(2026, 11, 22, 18, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, runAt string, delay int64) {
		d := time.Duration(delay)
		due, err := dueAt(runAt, d, fuzzNow)
		if err != nil {
			checkOneLine(t, err)
			if !due.IsZero() {
				t.Fatalf("dueAt(%q, %v) = %v with error %v", runAt, d, due, err)
			}
			if runAt != "" && d == 0 && !strings.Contains(err.Error(), strconv.Quote(runAt)) {
				t.Fatalf("error %q does not quote the --run-at given, %q", err, runAt)
			}
			return
		}
		switch {
		case d < 0:
			t.Fatalf("dueAt(%q, %v) accepted a negative delay", runAt, d)
		case runAt != "" && d > 0:
			t.Fatalf("dueAt(%q, %v) accepted both", runAt, d)
		case runAt != "":
			// What was accepted names one instant, which RFC 3339 writes
			// back and reads again unchanged.
			back, err := time.Parse(time.RFC3339Nano, due.Format(time.RFC3339Nano))
			if err != nil || !back.Equal(due) {
				t.Fatalf("--run-at %q gave %v, written %s, read back %v, %v", runAt, due, due.Format(time.RFC3339Nano), back, err)
			}
		case d > 0:
			if !due.After(fuzzNow) || due.Sub(fuzzNow) != d {
				t.Fatalf("--delay %v at %v gave %v", d, fuzzNow, due)
			}
		default:
			if !due.IsZero() {
				t.Fatalf("neither --run-at nor --delay gave %v, want zero (at once)", due)
			}
		}
	})
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1", "42", "0", "-1", "+7", "007", "9223372036854775807", "9223372036854775808", "0x10", "1_000", " 1", "1e3", "", "abc"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, err := parseID(s)
		if err != nil {
			checkOneLine(t, err)
			if id != 0 {
				t.Fatalf("parseID(%q) = %d with error %v", s, id, err)
			}
			return
		}
		if id <= 0 {
			t.Fatalf("parseID(%q) = %d: want a positive id", s, id)
		}
		// The id printed back (as dama prints ids) names the same task.
		if again, err := parseID(strconv.FormatInt(id, 10)); err != nil || again != id {
			t.Fatalf("parseID(%q) = %d, but its decimal form gives %d, %v", s, id, again, err)
		}
	})
}

func FuzzListenAddr(f *testing.F) {
	for _, s := range []string{":9464", "127.0.0.1:9464", "0.0.0.0:8080", "[::1]:8080", "[::]:80", "localhost:0", "host:", ":", "[]:80", "9464", "::1", "[fe80::1%eth0]:80", "a:b:c", "[::1", "a]:80", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		got, err := listenAddr(addr)
		if err != nil {
			// Not one line: net's error repeats the address as given, and
			// run makes one line of every error.
			if !strings.Contains(err.Error(), strconv.Quote(addr)) {
				t.Fatalf("error %q does not quote the address given, %q", err, addr)
			}
			return
		}
		host, port, err := net.SplitHostPort(got)
		if err != nil {
			t.Fatalf("listenAddr(%q) = %q, which does not split: %v", addr, got, err)
		}
		inHost, inPort, _ := net.SplitHostPort(addr)
		switch {
		case port != inPort:
			t.Fatalf("listenAddr(%q) = %q: port %q, want %q", addr, got, port, inPort)
		case inHost == "" && host != "127.0.0.1":
			t.Fatalf("listenAddr(%q) = %q: want localhost when no host is named", addr, got)
		case inHost != "" && host != inHost:
			t.Fatalf("listenAddr(%q) = %q: host %q, want %q", addr, got, host, inHost)
		}
	})
}

func FuzzParseOlderThan(f *testing.F) {
	for _, s := range []string{"", "720h", "0s", "0", "90m", "-1s", "1.5h", "30d", "1e3h", "9223372036854775807ns", "9223372036854775808ns", " 1h", "1h\n", "\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseOlderThan(s)
		if err != nil {
			checkOneLine(t, err)
			return
		}
		if d < 0 {
			t.Fatalf("parseOlderThan(%q) = %v, a negative duration", s, d)
		}
		if back, err := time.ParseDuration(s); err != nil || back != d {
			t.Fatalf("parseOlderThan(%q) = %v, but ParseDuration gives %v, %v", s, d, back, err)
		}
	})
}
