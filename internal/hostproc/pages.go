package hostproc

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProgramPages are the running program's read-only mappings that hold
// nothing but the file's pages (its code and constants), whose page-table
// entries Drop gives back. The pages stay in the page cache, shared by
// every process of the program, and come back on a minor fault when
// touched: a process that mostly waits stops counting, in its resident
// set, the pages of the program it touched while starting, or for a
// moment since (a collection of its heap), and those the kernel mapped
// around them (fault-around maps up to 16 pages for one touched). A
// mapping with pages of the process's own, in memory or swapped out, is
// left alone: a writable one, or a read-only one the loader relocated
// before protecting it (RELRO, in a position-independent or externally
// linked program), whose pages dropped would come back unrelocated. The program's file cannot change
// under the mappings: the kernel refuses writes to a running executable,
// and a replaced one is a new file.
type ProgramPages struct {
	exe    string
	ranges [][2]uint64
}

// FindProgramPages reads the program's mappings (ProgramPages).
func FindProgramPages() (*ProgramPages, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return nil, fmt.Errorf("read the program's path: %w", err)
	}
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("read the program's mappings: %w", err)
	}
	drop, err := fileOnlyMappings(smaps, exe)
	if err != nil {
		return nil, fmt.Errorf("read the program's mappings: %w", err)
	}
	return &ProgramPages{exe: exe, ranges: drop}, nil
}

// fileOnlyMappings returns the address ranges of the read-only private
// mappings of exe in smaps (/proc/<pid>/smaps) that hold no page of their
// own.
func fileOnlyMappings(smaps []byte, exe string) ([][2]uint64, error) {
	var drop [][2]uint64
	var cur *[2]uint64
	// A mapping's pages of its own are counted as Anonymous while in
	// memory and as Swap once swapped out: either is a relocated page,
	// which comes back from the file unrelocated once given back. The
	// mapping is given back only when both were read, and are 0.
	var anonymous, swap string
	settle := func() {
		if cur != nil && anonymous == "0" && swap == "0" {
			drop = append(drop, *cur)
		}
		cur, anonymous, swap = nil, "", ""
	}
	sc := bufio.NewScanner(bytes.NewReader(smaps))
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && strings.Contains(fields[0], "-") && !strings.HasSuffix(fields[0], ":") {
			// A mapping's header: address perms offset dev inode pathname.
			settle()
			if len(fields) < 6 || strings.Join(fields[5:], " ") != exe {
				continue
			}
			perms := fields[1]
			if len(perms) < 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
				continue
			}
			lo, hi, _ := strings.Cut(fields[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if err1 != nil || err2 != nil || end <= start {
				continue
			}
			cur = &[2]uint64{start, end}
			continue
		}
		if cur != nil && len(fields) >= 2 {
			switch fields[0] {
			case "Anonymous:":
				anonymous = fields[1]
			case "Swap:":
				swap = fields[1]
			}
		}
	}
	settle()
	return drop, sc.Err()
}

// Drop gives back the page-table entries of the mappings, and returns how
// many bytes they span. It allocates nothing.
func (p *ProgramPages) Drop() (int, error) {
	dropped := 0
	for _, m := range p.ranges {
		if err := madvise(uintptr(m[0]), uintptr(m[1]-m[0]), unix.MADV_DONTNEED); err != nil {
			return dropped, fmt.Errorf("give back the pages of %s at %x-%x: %w", p.exe, m[0], m[1], err)
		}
		dropped += int(m[1] - m[0])
	}
	return dropped, nil
}

func madvise(addr, length uintptr, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, length, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}
