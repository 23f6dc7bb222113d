package hostproc

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// FuzzParseStat reads arbitrary stat lines, and the lines the kernel
// writes for a process whose command name (anyone's to choose: it is the
// name of the program run) holds spaces, parentheses and digits that look
// like fields.
func FuzzParseStat(f *testing.F) {
	for _, s := range []struct {
		data  string
		comm  string
		state byte
		pgid  int32
		ticks uint64
	}{
		{"42 (sample-etl) S 1 42 42 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 123456 8192000 250 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n", "sample-etl", 'S', 42, 123456},
		{"42 (a) b (c)) S 1 77 77 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0", "a) R 1 2 3 4 5", 'Z', 1, 0},
		{"42 () Z 1 -5 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551615 0 0", ")", 'X', -1, 1<<64 - 1},
		{"42 (x) S 1 2 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 18446744073709551616", "(", 'D', 0, 1},
		{"42 (x) S 1 notanumber 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", "\n\t ", 'I', 2147483647, 99},
		{"42 (x) S 1 2 3", "", 'T', -2147483648, 5},
		{"42 x S 1 2 3 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", "x y z", 't', 7, 7},
		{")", "))))))))))))))))", 'W', 1, 1},
		{"", "\xff\xfe", 'P', 1, 1},
	} {
		f.Add([]byte(s.data), s.comm, s.state, s.pgid, s.ticks)
	}
	f.Fuzz(func(t *testing.T, data []byte, comm string, state byte, pgid int32, ticks uint64) {
		if st, err := parseStat(42, data); err != nil {
			if st != (Stat{}) || err.Error() == "" {
				t.Fatalf("parseStat(%q) = %+v, %q: want nothing and a message", data, st, err)
			}
		} else if st.PID != 42 || !bytes.Contains(data, []byte{')'}) || strings.IndexByte(" \t\n\v\f\r", st.State) >= 0 {
			t.Fatalf("parseStat(%q) = %+v", data, st)
		}

		// The kernel keeps at most 15 bytes of a name, never a NUL; a state
		// is one letter.
		comm = strings.ReplaceAll(comm, "\x00", "")
		if len(comm) > 15 {
			comm = comm[:15]
		}
		state = "RSDZTtXxKWPI"[int(state)%12]
		line := fmt.Sprintf("42 (%s) %c 1 %d %d 0 -1 4194560 120 0 0 0 3 1 0 0 20 0 1 0 %d 8192000 250 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
			comm, state, pgid, pgid, ticks)
		want := Stat{PID: 42, State: state, PPID: 1, PGID: int(pgid), StartTicks: ticks}
		if st, err := parseStat(42, []byte(line)); err != nil || st != want {
			t.Fatalf("parseStat(%q) = %+v, %v; want %+v", line, st, err, want)
		}
	})
}
