// Command dama is a supervisor for long-running ETL tasks: it enqueues tasks
// through River, runs each as a detached process holding a lock on its
// :INITIAL event, and adopts running tasks after a restart.
package main

import "github.com/dama-etl/dama/cmd/dama/damacli"

func main() {
	damacli.Main(damacli.Options{Pods: podRunner})
}
