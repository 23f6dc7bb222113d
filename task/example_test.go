package task_test

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/dama-etl/dama/protocol"
	"github.com/dama-etl/dama/task"
)

// A task's program reads its task from the environment its task process
// set, resumes from the last checkpoint, and reports on the events pipe.
// (Here the example sets that environment itself, and prints the lines the
// task process would read.)
func Example() {
	pipe := taskProcess()

	t, err := task.FromEnv()
	if err != nil {
		panic(err)
	}
	var args struct {
		Files []string `json:"files"`
	}
	if err := t.DecodeArgs(&args); err != nil {
		panic(err)
	}
	var resume struct {
		Next int `json:"next"`
	}
	if _, err := t.DecodeLastCheckpoint(&resume); err != nil {
		panic(err)
	}
	for i := resume.Next; i < len(args.Files); i++ {
		// ... load args.Files[i] ...
		if err := t.Progress(map[string]int{"step": i + 1, "of": len(args.Files)}); err != nil {
			panic(err)
		}
		if err := t.Checkpoint(map[string]int{"next": i + 1}); err != nil {
			panic(err)
		}
	}
	if err := t.Event("rows_loaded", map[string]int{"rows": 42000}); err != nil {
		panic(err)
	}
	fmt.Println(t.Event("final", nil))
	if err := t.Fail("the warehouse refused the last batch", false); err != nil {
		panic(err)
	}

	for _, line := range pipe(6) {
		fmt.Println(line)
	}
	// Output:
	// event type "final" is reserved for dama
	// {"type":"progress","payload":{"of":3,"step":2}}
	// {"type":"checkpoint","payload":{"next":2}}
	// {"type":"progress","payload":{"of":3,"step":3}}
	// {"type":"checkpoint","payload":{"next":3}}
	// {"type":"rows_loaded","payload":{"rows":42000}}
	// {"type":"failure","payload":{"error":"the warehouse refused the last batch","retry":false}}
}

// taskProcess is the one fake task process of this test binary: FromEnv
// reads the environment once.
var taskProcess = sync.OnceValue(fakeTaskProcess)

// fakeTaskProcess sets the environment a task process gives a task's
// program (its second attempt, resuming after the first file) and returns
// a function that reads n lines from the events pipe.
func fakeTaskProcess() func(n int) []string {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		panic(err)
	}
	for name, value := range map[string]string{
		protocol.ContextIDEnv:  "42",
		protocol.KindEnv:       "load",
		protocol.AttemptEnv:    "2",
		protocol.ArgsEnv:       `{"files": ["a.csv", "b.csv", "c.csv"]}`,
		protocol.CheckpointEnv: `{"next": 1}`,
		protocol.EventsFDEnv:   strconv.Itoa(fds[1]),
	} {
		os.Setenv(name, value)
	}
	// Read all along, as a task process does: a program's write must
	// never wait on the reader.
	lines := make(chan string, 1000)
	go func() {
		r := bufio.NewScanner(os.NewFile(uintptr(fds[0]), "events"))
		r.Buffer(nil, 2<<20)
		for r.Scan() {
			lines <- r.Text()
		}
	}()
	return func(n int) []string {
		var got []string
		for len(got) < n {
			select {
			case l := <-lines:
				got = append(got, l)
			case <-time.After(10 * time.Second):
				return got
			}
		}
		return got
	}
}
