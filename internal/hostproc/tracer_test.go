package hostproc

import (
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHelperProcessSleeps is the process the tracer test traces: this
// test binary again, whose runtime runs several threads.
func TestHelperProcessSleeps(t *testing.T) {
	if os.Getenv("DAMA_HOSTPROC_HELPER") != "sleep" {
		t.Skip("the process TestTracerSeesATracerOfAnyThread traces")
	}
	// Until the test kills it (SIGKILL): nothing sends SIGTERM.
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
}

// A tracer attached to a thread other than a process's first shows only
// in that thread's status: Tracer finds it all the same.
func TestTracerSeesATracerOfAnyThread(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcessSleeps$")
	cmd.Env = append(os.Environ(), "DAMA_HOSTPROC_HELPER=sleep")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	pid := cmd.Process.Pid
	var thread int
	deadline := time.Now().Add(10 * time.Second)
	for thread == 0 {
		entries, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if tid, _ := strconv.Atoi(e.Name()); tid != pid {
				thread = tid
			}
		}
		if thread == 0 && time.Now().After(deadline) {
			t.Fatal("the helper process started no second thread in 10s")
		}
	}
	if tracer, err := Tracer(pid); err != nil || tracer != 0 {
		t.Fatalf("Tracer(%d) = %d, %v before anything traced it", pid, tracer, err)
	}
	// A tracer is a thread: this goroutine stays on it until it detaches.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := unix.PtraceSeize(thread); err != nil {
		if err == syscall.EPERM {
			t.Skipf("this host does not let a process trace its child's threads: %v", err)
		}
		t.Fatal(err)
	}
	defer func() {
		// A tracee is let go only stopped, and then waited for by its
		// tracer, this thread.
		if err := unix.PtraceInterrupt(thread); err != nil {
			t.Errorf("interrupt thread %d: %v", thread, err)
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(thread, &ws, unix.WALL, nil); err != nil {
			t.Errorf("wait for thread %d to stop: %v", thread, err)
			return
		}
		if err := unix.PtraceDetach(thread); err != nil {
			t.Errorf("detach from thread %d: %v", thread, err)
		}
	}()
	// TracerPid names the tracing thread: one of this process's.
	tracer, err := Tracer(pid)
	if _, serr := os.Stat("/proc/self/task/" + strconv.Itoa(tracer)); err != nil || tracer == 0 || serr != nil {
		t.Fatalf("Tracer(%d) = %d, %v with thread %d traced by a thread of process %d", pid, tracer, err, thread, os.Getpid())
	}
}
