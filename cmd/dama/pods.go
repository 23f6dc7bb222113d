//go:build !kubernetes

package main

import (
	"log/slog"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/supervisor"
)

// podRunner is the runner of cfg's kubernetes kinds: none in a dama built
// without -tags kubernetes, which keeps Kubernetes' client (38 MB of
// binary, 45 s of a cold build) out of a host's dama.
func podRunner(*config.Config, *slog.Logger) (supervisor.Launcher, error) { return nil, nil }
