package scalebench

import (
	"os"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A command name with a space and a parenthesis.
	st, err := parseProcStat([]byte("4242 (dama (x) y) S 17 4242 4242 0 -1 4194560 1000 0 0 0 250 31 0 0 20 0 9 0 12345 1000000 2000 18446744073709551615\n"))
	if err != nil {
		t.Fatal(err)
	}
	if st.PPID != 17 || st.CPU != 281 {
		t.Fatalf("got %+v, want ppid 17, cpu 281", st)
	}
	self, err := ReadProcStat(os.Getpid())
	if err != nil || self.PPID != os.Getppid() {
		t.Fatalf("ReadProcStat(self) = %+v, %v; want ppid %d", self, err, os.Getppid())
	}
}

func TestParseRSS(t *testing.T) {
	n, err := parseRSS([]byte("Name:\tdama\nVmPeak:\t  9000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 1 kB\n"))
	if err != nil || n != 12345<<10 {
		t.Fatalf("parseRSS = %d, %v; want %d", n, err, 12345<<10)
	}
	if _, err := parseRSS([]byte("Name:\tkthreadd\n")); err == nil {
		t.Fatal("no error without VmRSS")
	}
}

func TestCPUDelta(t *testing.T) {
	before := map[int]uint64{1: 100, 2: 50, 3: 10}
	after := map[int]uint64{1: 150, 3: 30, 4: 999} // 2 exited, 4 is new
	if d := CPUDelta(before, after); d != 700*time.Millisecond {
		t.Fatalf("CPUDelta = %s, want 700ms", d)
	}
}

func TestSocketsTo(t *testing.T) {
	table := `  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1538 00000000:0000 0A 00000000:00000000 00:00000000 00000000   102        0 111 1 0000000000000000 100 0 0 10 0
   1: 0100007F:A2C4 0100007F:1538 01 00000000:00000000 00:00000000 00000000     0        0 222 1 0000000000000000 20 4 30 10 -1
   2: 0100007F:1538 0100007F:A2C4 01 00000000:00000000 00:00000000 00000000   102        0 333 1 0000000000000000 20 4 30 10 -1
   3: 0100007F:A2C6 0100007F:1538 06 00000000:00000000 00:00000000 00000000     0        0 444 1 0000000000000000 20 4 30 10 -1
`
	got := socketsTo([]byte(table), 0x1538)
	if len(got) != 1 || !got["222"] {
		t.Fatalf("socketsTo = %v; want only the established client end, inode 222", got)
	}
}

func TestDeadNotRemovable(t *testing.T) {
	pg15 := `finished vacuuming "db.public.river_job": index scans: 0
pages: 0 removed, 3 remain, 3 scanned (100.00% of total)
tuples: 0 removed, 517 remain, 412 are dead but not yet removable
removable cutoff: 1234, which was 56 XIDs old when operation ended`
	if n, ok := DeadNotRemovable(pg15); !ok || n != 412 {
		t.Fatalf("PostgreSQL 15: %d, %v; want 412", n, ok)
	}
	pg13 := "\"river_job\": found 0 removable, 517 nonremovable row versions in 3 out of 3 pages\n412 dead row versions cannot be removed yet, oldest xmin: 1234"
	if n, ok := DeadNotRemovable(pg13); !ok || n != 412 {
		t.Fatalf("PostgreSQL 13: %d, %v; want 412", n, ok)
	}
	if _, ok := DeadNotRemovable(`vacuuming "db.public.river_job"`); ok {
		t.Fatal("a count in a notice without one")
	}
}

func TestErrorLines(t *testing.T) {
	log := `2025-01-01 10:00:00.001 UTC [101] ERROR:  could not obtain lock on row in relation "event_store"
2025-01-01 10:00:00.001 UTC [101] STATEMENT:  SELECT ... FOR UPDATE NOWAIT
2025-01-01 10:00:01.002 UTC [102] ERROR:  could not obtain lock on row in relation "event_store"
2025-01-01 10:00:02.003 UTC [103] LOG:  checkpoint starting: time
2025-01-01 10:00:03.004 UTC [104] ERROR:  canceling statement due to user request at 42
`
	n, msgs := ErrorLines(log)
	if n != 3 || len(msgs) != 2 || msgs[0].Count != 2 || msgs[0].Message != `could not obtain lock on row in relation "event_store"` ||
		msgs[1].Message != "canceling statement due to user request at N" {
		t.Fatalf("ErrorLines = %d, %+v", n, msgs)
	}
}

func TestPercentileAndMedian(t *testing.T) {
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	if p50, p99 := Percentile(ds, 0.5), Percentile(ds, 0.99); p50 != 50 || p99 != 99 {
		t.Fatalf("p50 %v p99 %v; want 50, 99", p50, p99)
	}
	if m := Median([]float64{3, 1, 2, 4}); m != 2 {
		t.Fatalf("median %v, want 2", m)
	}
}
