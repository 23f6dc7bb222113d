// Command dama is dama's command with the launcher of the kubernetes kinds
// (package kubernetes): the dama of dama's image (scripts/image.sh), which
// runs each attempt of such a kind in a pod of its own.
package main

import (
	"log/slog"

	"github.com/dama-etl/dama/cmd/dama/damacli"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/kubernetes"
	"github.com/dama-etl/dama/supervisor"
)

func main() {
	damacli.Main(damacli.Options{Pods: pods})
}

// pods is the launcher of cfg's kubernetes kinds, nil when it has none.
func pods(cfg *config.Config, logger *slog.Logger) (supervisor.Launcher, error) {
	if !cfg.Runs(config.RunnerKubernetes) {
		return nil, nil
	}
	return kubernetes.New(cfg, logger)
}
