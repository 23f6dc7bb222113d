package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/internal/web"
	"github.com/dama-etl/dama/supervisor"
)

// webTokenEnv names the environment variable with the action token: an
// argument would show in a process listing.
const webTokenEnv = "DAMA_WEB_TOKEN"

func newWebCommand(g *globals) *cobra.Command {
	var (
		listen   string
		readOnly bool
	)
	cmd := &cobra.Command{
		Use:   "web",
		Short: "Serve the status page (and /metrics) over the database",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := config.Load(g.configPath)
			if err != nil {
				return err
			}
			logger, err := g.logger(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			addr, err := listenAddr(listen)
			if err != nil {
				return err
			}
			pool, _, err := connectMigrated(cmd.Context(), 0)
			if err != nil {
				return err
			}
			defer pool.Close()
			host, _, _ := net.SplitHostPort(addr)
			ip := net.ParseIP(host)
			page, err := web.New(pool, cfg, web.Options{
				Token:        os.Getenv(webTokenEnv),
				ReadOnly:     readOnly,
				LoopbackOnly: host == "localhost" || (ip != nil && ip.IsLoopback()),
				Logger:       logger,
			})
			if err != nil {
				return err
			}
			reg := newMetricsRegistry()
			reg.MustRegister(supervisor.NewStatsCollector(pool), supervisor.NewPoolCollector(pool))
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			mux := http.NewServeMux()
			mux.Handle("/", page)
			mux.Handle("GET /metrics", metricsHandler(reg, logger))
			srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: time.Minute}
			logger.Info("serving the status page", "addr", "http://"+ln.Addr().String()+"/", "read_only", readOnly)
			go func() {
				<-cmd.Context().Done()
				sctx, cancel := context.WithTimeout(context.WithoutCancel(cmd.Context()), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	g.addLogFormat(cmd)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on (a bare :PORT is on localhost)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "serve without actions (else they need $"+webTokenEnv+")")
	return cmd
}
