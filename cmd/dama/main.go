// Command dama is a supervisor for long-running ETL tasks: it enqueues tasks
// through River, runs each as a detached process holding a lock on its
// :INITIAL event, and adopts running tasks after a restart. It runs the
// kinds that run on a host; the Kubernetes module's dama (kubernetes/cmd/dama,
// the image's) runs those that run in pods too.
package main

import "github.com/dama-etl/dama/cmd/dama/damacli"

func main() {
	damacli.Main(damacli.Options{})
}
