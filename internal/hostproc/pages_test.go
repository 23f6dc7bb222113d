package hostproc

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssFile returns the resident file-backed memory of this process, in kB.
func rssFile(t *testing.T) int {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "RssFile:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no RssFile in /proc/self/status")
	return 0
}

// The program's read-only pages leave the resident set, and the program
// runs on, faulting back what it touches.
func TestDropProgramPagesShrinksTheResidentSet(t *testing.T) {
	before := rssFile(t)
	pages, err := FindProgramPages()
	if err != nil {
		t.Fatal(err)
	}
	n, err := pages.Drop()
	if err != nil {
		t.Fatal(err)
	}
	after := rssFile(t)
	if n == 0 || after >= before {
		t.Fatalf("dropped %d bytes of mappings: RssFile %d kB before, %d kB after", n, before, after)
	}
	t.Logf("RssFile %d kB before, %d kB after dropping %d bytes of mappings", before, after, n)
}

// A read-only mapping of the program is given back only when smaps says
// it holds no page of its own, in memory (Anonymous) or swapped out
// (Swap): a relocated page swapped out would come back from the file
// unrelocated.
func TestOnlyMappingsWithoutPagesOfTheirOwnAreGivenBack(t *testing.T) {
	const exe = "/usr/bin/dama tool"
	mapping := func(addr, perms, path, anonymous, swap string) string {
		m := addr + " " + perms + " 00000000 08:01 1234    " + path + "\nRss:  64 kB\n"
		if anonymous != "" {
			m += "Anonymous:  " + anonymous + " kB\n"
		}
		m += "LazyFree:  0 kB\n"
		if swap != "" {
			m += "Swap:  " + swap + " kB\n"
		}
		return m + "VmFlags: rd mr mw me\n"
	}
	smaps := mapping("00400000-00500000", "r-xp", exe, "0", "0") + // code: given back
		mapping("00500000-00600000", "r--p", exe, "0", "8") + // relocated, swapped out
		mapping("00600000-00700000", "r--p", exe, "4", "0") + // relocated, in memory
		mapping("00700000-00800000", "r--p", exe, "0", "") + // no Swap line: unknown
		mapping("00800000-00900000", "rw-p", exe, "0", "0") + // writable
		mapping("00900000-00a00000", "r--s", exe, "0", "0") + // shared
		mapping("00a00000-00b00000", "r--p", "/usr/bin/other", "0", "0") +
		mapping("00b00000-00c00000", "r--p", exe, "0", "0") // constants: given back
	got, err := fileOnlyMappings([]byte(smaps), exe)
	if err != nil {
		t.Fatal(err)
	}
	want := [][2]uint64{{0x400000, 0x500000}, {0xb00000, 0xc00000}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("given back %x, want %x", got, want)
	}
}
