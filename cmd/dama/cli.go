package main

import (
	"fmt"
	"io"
	"log/slog"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
)

func newLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// addLogFormat gives cmd, a command that logs, the --log-format flag.
func (g *globals) addLogFormat(cmd *cobra.Command) {
	cmd.Flags().StringVar(&g.logFormat, "log-format", "text", "format of the logs: text (logfmt) or json (one object per line)")
}

// logger returns the logger of --log-format: logfmt text (the default) or
// one JSON object per line.
func (g *globals) logger(w io.Writer) (*slog.Logger, error) {
	switch g.logFormat {
	case "text":
		return newLogger(w), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", g.logFormat)
}

// completeKinds completes a kind of the configuration.
func (g *globals) completeKinds(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, err := config.Load(g.configPath)
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return cfg.KindNames(), cobra.ShellCompDirectiveNoFileComp
}

// completeQueues completes a queue of the configuration.
func (g *globals) completeQueues(_ *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	cfg, err := config.Load(g.configPath)
	if err != nil || len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return cfg.QueueNames(), cobra.ShellCompDirectiveNoFileComp
}
