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

// DropProgramPages gives back the page-table entries of the running
// program's read-only mappings (its code and constants), and returns how
// many bytes they spanned. The pages stay in the page cache, shared by
// every process of the program, and come back on a minor fault when
// touched: a process that has started and then mostly waits stops
// counting, in its resident set, the pages of the program it touched
// while starting (and those the kernel mapped around them). Writable
// mappings are left alone: dropping those would lose their contents.
// The program's file cannot change under the mappings: the kernel
// refuses writes to a running executable, and a replaced one is a new
// file.
func DropProgramPages() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("read the program's path: %w", err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("read the program's mappings: %w", err)
	}
	dropped := 0
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		// address perms offset dev inode pathname
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || strings.Join(fields[5:], " ") != exe {
			continue
		}
		perms := fields[1]
		if len(perms) < 4 || perms[1] != '-' || perms[3] != 'p' {
			continue
		}
		lo, hi, ok := strings.Cut(fields[0], "-")
		if !ok {
			continue
		}
		start, err1 := strconv.ParseUint(lo, 16, 64)
		end, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || end <= start {
			continue
		}
		if err := madvise(uintptr(start), uintptr(end-start), unix.MADV_DONTNEED); err != nil {
			return dropped, fmt.Errorf("give back the pages of %s at %s: %w", exe, fields[0], err)
		}
		dropped += int(end - start)
	}
	return dropped, sc.Err()
}

func madvise(addr, length uintptr, advice int) error {
	if _, _, errno := unix.Syscall(unix.SYS_MADVISE, addr, length, uintptr(advice)); errno != 0 {
		return errno
	}
	return nil
}
