// Command dama-taskrunner is the program of the task processes of the
// Kubernetes module's dama (kubernetes/cmd/dama), built with it so that
// the two are of one build, which a supervisor checks (see the core's
// cmd/dama-taskrunner).
package main

import "github.com/dama-etl/dama/taskrunner"

func main() {
	taskrunner.Main()
}
