// Command dama-taskrunner is the program of dama's task processes: a
// task's runner, which holds its lock and relays its command's events, and
// the host's lock keeper. A supervisor runs it, when it is installed beside
// the dama binary and of the same build, instead of dama itself: it holds
// only what a task process needs, so that each of the host's runners
// touches fewer of its program's pages (docs/performance.md). It is not
// run by hand.
//
//	go install github.com/dama-etl/dama/cmd/dama github.com/dama-etl/dama/cmd/dama-taskrunner
package main

import "github.com/dama-etl/dama/taskrunner"

func main() {
	taskrunner.Main(nil)
}
