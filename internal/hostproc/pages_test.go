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
