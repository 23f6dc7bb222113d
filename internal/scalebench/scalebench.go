// Package scalebench is the scale benchmark of `scripts/bench.sh scale`: what
// quietly running tasks cost a supervisor, its task processes and the
// database, at several sizes and in each lock mode, against the floors of
// plain River and a bare fork/exec. The benchmark itself is BenchmarkScale
// (scale_test.go); this file holds what it reads from /proc, from VACUUM
// VERBOSE and from the server log.
//
// The commands it runs are internal/scalebench/quiet (a task command that
// costs nothing while it waits) and internal/scalebench/floor (the fork/exec
// floor).
package scalebench

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ClockTicks is USER_HZ, the unit of CPU times in /proc/<pid>/stat: 100 on
// every Linux platform Go runs on.
const ClockTicks = 100

// ProcStat is what the benchmark reads from /proc/<pid>/stat.
type ProcStat struct {
	PPID int
	// CPU is utime + stime (every thread's), in clock ticks.
	CPU uint64
}

// ReadProcStat reads /proc/<pid>/stat.
func ReadProcStat(pid int) (ProcStat, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ProcStat{}, err
	}
	return parseProcStat(data)
}

func parseProcStat(data []byte) (ProcStat, error) {
	// The command name, in parentheses, may hold spaces and parentheses:
	// the fields start after the last ')'.
	end := bytes.LastIndexByte(data, ')')
	if end < 0 {
		return ProcStat{}, fmt.Errorf("malformed stat %q", data)
	}
	// fields[0] is the state (field 3); ppid is field 4, utime 14, stime 15.
	fields := strings.Fields(string(data[end+1:]))
	if len(fields) < 13 {
		return ProcStat{}, fmt.Errorf("short stat %q", data)
	}
	ppid, err1 := strconv.Atoi(fields[1])
	utime, err2 := strconv.ParseUint(fields[11], 10, 64)
	stime, err3 := strconv.ParseUint(fields[12], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return ProcStat{}, fmt.Errorf("malformed stat %q", data)
	}
	return ProcStat{PPID: ppid, CPU: utime + stime}, nil
}

// CPUTicks sums the CPU time of pids, reading each once; a process that is
// gone counts 0 and is left out of the returned set, so that a delta is
// taken over the processes present at both ends.
func CPUTicks(pids []int) map[int]uint64 {
	ticks := make(map[int]uint64, len(pids))
	for _, pid := range pids {
		if st, err := ReadProcStat(pid); err == nil {
			ticks[pid] = st.CPU
		}
	}
	return ticks
}

// CPUDelta is the CPU time spent between two CPUTicks readings by the
// processes present in both.
func CPUDelta(before, after map[int]uint64) time.Duration {
	var sum uint64
	for pid, a := range after {
		if b, ok := before[pid]; ok && a >= b {
			sum += a - b
		}
	}
	return time.Duration(sum) * time.Second / ClockTicks
}

// RSS returns the resident set size of pid (VmRSS) in bytes.
func RSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseRSS(data)
}

// PSS returns the proportional set size of pid in bytes: its resident
// pages, each shared one divided by the processes that map it, which is
// what the host spends on it (/proc/PID/smaps_rollup's Pss).
func PSS(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, err
	}
	return parseKB(data, "Pss:")
}

func parseRSS(status []byte) (int64, error) { return parseKB(status, "VmRSS:") }

func parseKB(status []byte, key string) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), key)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("malformed %s line %q", key, sc.Text())
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("malformed %s line %q", key, sc.Text())
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS (a zombie or a kernel thread)")
}

// Pids lists every process in /proc.
func Pids() []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		if pid, err := strconv.Atoi(e.Name()); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids
}

// Children lists the processes whose parent is ppid.
func Children(ppid int) []int {
	var kids []int
	for _, pid := range Pids() {
		if st, err := ReadProcStat(pid); err == nil && st.PPID == ppid {
			kids = append(kids, pid)
		}
	}
	return kids
}

// ProcessesOf lists the processes running the executable at path whose
// first argument is arg0 (any, when arg0 is empty).
func ProcessesOf(path, arg0 string) []int {
	var pids []int
	for _, pid := range Pids() {
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || exe != path {
			continue
		}
		if arg0 != "" {
			cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err != nil {
				continue
			}
			args := strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")
			if len(args) < 2 || args[1] != arg0 {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// ConnectionsTo counts, for each of pids, its established TCP connections
// to port on this host (IPv4 and IPv6): the server connections that process
// holds, whatever it calls them.
func ConnectionsTo(port int, pids []int) (map[int]int, error) {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(table)
		if err != nil {
			if os.IsNotExist(err) {
				continue
			}
			return nil, err
		}
		for inode := range socketsTo(data, port) {
			inodes[inode] = true
		}
	}
	counts := make(map[int]int, len(pids))
	for _, pid := range pids {
		fdDir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(fdDir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(fdDir, fd.Name()))
			if err != nil {
				continue
			}
			if inode, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
				counts[pid]++
			}
		}
	}
	return counts, nil
}

// socketsTo returns the inodes of the established sockets in a
// /proc/net/tcp table whose remote port is port: the client ends of
// connections to a server listening on it.
func socketsTo(table []byte, port int) map[string]bool {
	inodes := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(table))
	sc.Scan() // the header
	for sc.Scan() {
		// sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
		f := strings.Fields(sc.Text())
		if len(f) < 10 || f[3] != "01" || !strings.HasSuffix(f[2], want) {
			continue
		}
		inodes[f[9]] = true
	}
	return inodes
}

var (
	// PostgreSQL 15 and later; 14 says "... are dead but not yet removable"
	// too, older ones the second form, in the DETAIL.
	deadRE    = regexp.MustCompile(`(\d+) are dead but not yet removable`)
	deadOldRE = regexp.MustCompile(`(\d+) dead row versions cannot be removed yet`)
)

// DeadNotRemovable reads, from the text of one VACUUM VERBOSE notice
// (message and detail), how many dead row versions it could not remove.
func DeadNotRemovable(notice string) (int64, bool) {
	for _, re := range []*regexp.Regexp{deadRE, deadOldRE} {
		if m := re.FindStringSubmatch(notice); m != nil {
			n, err := strconv.ParseInt(m[1], 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// MessageCount is one distinct message and how often it appeared.
type MessageCount struct {
	Message string
	Count   int
}

var digitsRE = regexp.MustCompile(`\d+`)

// ErrorLines counts the lines of a PostgreSQL server log that report an
// ERROR, and the distinct messages among them (numbers replaced by N), most
// frequent first.
func ErrorLines(log string) (int, []MessageCount) {
	counts := map[string]int{}
	total := 0
	for line := range strings.Lines(log) {
		_, msg, ok := strings.Cut(line, "ERROR:")
		if !ok {
			continue
		}
		total++
		counts[digitsRE.ReplaceAllString(strings.TrimSpace(msg), "N")]++
	}
	out := make([]MessageCount, 0, len(counts))
	for m, c := range counts {
		out = append(out, MessageCount{m, c})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Count != out[j].Count {
			return out[i].Count > out[j].Count
		}
		return out[i].Message < out[j].Message
	})
	return total, out
}

// Percentile returns the nearest-rank p-quantile (0 < p <= 1) of ds; NaN
// milliseconds when ds is empty.
func Percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(math.Ceil(p*float64(len(s)))) - 1
	return Millis(s[min(max(i, 0), len(s)-1)])
}

// Millis is d in milliseconds.
func Millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Median returns the median of xs (the lower middle one for an even count);
// NaN when xs is empty.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}
