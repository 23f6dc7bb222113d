// Command dama-taskrunner is the program of the task processes of the
// Kubernetes module's dama (kubernetes/cmd/dama), built with it so that
// the two are of one build, which a supervisor checks (see the core's
// cmd/dama-taskrunner). In a pod, its runner starts the command through
// dama's shim (podStarter), whose socket the pod's spec names after the
// launch's arguments (shim.SocketFlag).
package main

import (
	"os"
	"slices"

	"github.com/dama-etl/dama/kubernetes/shim"
	"github.com/dama-etl/dama/taskrunner"
)

func main() {
	var starter taskrunner.Starter
	// The core's launch does not know the flag: it is taken out.
	if i := slices.Index(os.Args, shim.SocketFlag); i > 0 && i+1 < len(os.Args) {
		starter = &podStarter{socket: os.Args[i+1]}
		os.Args = slices.Delete(os.Args, i, i+2)
	}
	taskrunner.Main(starter)
}
