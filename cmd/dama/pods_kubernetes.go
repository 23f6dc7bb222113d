//go:build kubernetes

package main

import (
	"log/slog"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/podrunner"
	"github.com/dama-etl/dama/supervisor"
)

// podRunner is the runner of cfg's kubernetes kinds, nil when it has
// none.
func podRunner(cfg *config.Config, logger *slog.Logger) (supervisor.Launcher, error) {
	if !cfg.Runs(config.RunnerKubernetes) {
		return nil, nil
	}
	return podrunner.New(cfg, logger)
}
