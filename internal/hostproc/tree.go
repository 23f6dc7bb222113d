package hostproc

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrNoChildrenList reports a kernel without /proc/PID/task/TID/children
// (CONFIG_PROC_CHILDREN): a tree cannot be walked, and the attempt's
// processes are found by reading every process (Attempt.Processes).
var ErrNoChildrenList = errors.New("the kernel lists no children in /proc (CONFIG_PROC_CHILDREN)")

// BecomeSubreaper makes this process the subreaper of its descendants
// (PR_SET_CHILD_SUBREAPER), and checks that its children can be listed:
// whatever a task process's command starts, in whatever group or session,
// stays below it, so that a walk of its own tree (Descendants) finds the
// attempt's processes without reading, as each of many tasks ending at
// once would, every process of the host.
func BecomeSubreaper() error {
	if _, err := os.Stat("/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/children"); errors.Is(err, fs.ErrNotExist) {
		return ErrNoChildrenList
	} else if err != nil {
		return fmt.Errorf("list this process's children: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a subreaper: %w", err)
	}
	return nil
}

// Children returns the children of process pid, of every one of its
// threads: a child is listed under the thread that forked it.
func Children(pid int) ([]int, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	threads, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("process %d: %w", pid, ErrGone)
	}
	if err != nil {
		return nil, fmt.Errorf("list the threads of process %d: %w", pid, err)
	}
	var kids []int
	for _, t := range threads {
		data, err := os.ReadFile(dir + "/" + t.Name() + "/children")
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// The thread ended meanwhile; its children moved to another.
			continue
		case err != nil:
			return nil, fmt.Errorf("list the children of process %d: %w", pid, err)
		}
		for f := range strings.FieldsSeq(string(data)) {
			if kid, err := strconv.Atoi(f); err == nil {
				kids = append(kids, kid)
			}
		}
	}
	return kids, nil
}

// Descendants returns the processes below pid: its children, theirs, and
// so on, zombies included (a zombie's children were reparented already).
// A process that ends during the walk is left out. The kernel's lists are
// exact only for processes that do not fork meanwhile: a caller that must
// find them all kills what it found and walks again until nothing is left
// (a process whose parent was killed is reparented to the subreaper, where
// the next walk finds it).
func Descendants(pid int) ([]Stat, error) {
	var (
		found []Stat
		errs  []error
	)
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		kids, err := Children(p)
		if err != nil && !errors.Is(err, ErrGone) {
			errs = append(errs, err)
		}
		for _, k := range kids {
			st, err := ReadStat(k)
			if err != nil && !errors.Is(err, ErrGone) {
				errs = append(errs, err)
			}
			if err != nil || st.PPID != p {
				// Gone since p's list was read, its pid perhaps another
				// process's by now; or reparented, to the subreaper, whose
				// list the caller reads again.
				continue
			}
			found = append(found, st)
			if !st.Zombie() {
				queue = append(queue, k)
			}
		}
	}
	return found, errors.Join(errs...)
}
