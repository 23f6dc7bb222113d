package testenv

import (
	"fmt"
	"os"
	"testing"
)

// exampleT lets Example functions, which have no *testing.T, use New: a
// failure panics, and cleanups run when Close is called.
type exampleT struct {
	testing.TB
	cleanups []func()
	dir      string
}

func (t *exampleT) Helper() {}

func (t *exampleT) Cleanup(f func()) { t.cleanups = append(t.cleanups, f) }

func (t *exampleT) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

func (t *exampleT) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }

func (t *exampleT) Errorf(f string, a ...any) { fmt.Fprintf(os.Stderr, f+"\n", a...) }

func (t *exampleT) Logf(f string, a ...any) {}

func (t *exampleT) Failed() bool { return false }

func (t *exampleT) TempDir() string {
	if t.dir == "" {
		dir, err := os.MkdirTemp("", "dama-example-")
		if err != nil {
			panic(err)
		}
		t.dir = dir
		t.cleanups = append(t.cleanups, func() { os.RemoveAll(dir) })
	}
	return t.dir
}

// ForExample is New for Example functions: it returns the environment and a
// function that tears it down.
func ForExample() (*Env, func()) {
	t := &exampleT{}
	env := New(t)
	return env, func() {
		for i := len(t.cleanups) - 1; i >= 0; i-- {
			t.cleanups[i]()
		}
	}
}
