package web

import (
	"testing"
)

// FuzzParseLogPos: any ?offset= of a log read either names a place in the
// tail the database keeps, which reads back as written, or is refused.
func FuzzParseLogPos(f *testing.F) {
	for _, s := range []string{"0:0", "3:1048576", "", "1", ":", "-1:0", "1:-5", "2:9223372036854775807", "1:2:3", " 1:2", "01:02", "1:0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, ok := parseLogPos(s)
		if !ok {
			return
		}
		if p.Attempt < 0 || p.Offset < 0 {
			t.Fatalf("%q read as %+v", s, p)
		}
		again, ok := parseLogPos(formatLogPos(p))
		if !ok || again != p {
			t.Fatalf("%q read as %+v, written %q, read again as %+v (%v)", s, p, formatLogPos(p), again, ok)
		}
	})
}
