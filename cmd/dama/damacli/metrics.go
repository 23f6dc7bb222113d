package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// listenAddr is addr, on localhost when it names no host (":9464"):
// anything dama serves is local unless asked otherwise ("0.0.0.0:9464").
func listenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("listen address %q: want HOST:PORT, e.g. 127.0.0.1:9464: %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// metricsServer serves reg's metrics on /metrics.
type metricsServer struct {
	srv *http.Server
	ln  net.Listener
}

// newMetricsRegistry is a registry with the Go runtime's and the process's
// metrics, for dama's own to be added to.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// listenMetrics starts listening on addr at once, so that a bad address is
// an error before anything else starts; serve then serves.
func listenMetrics(addr string, reg *prometheus.Registry, logger *slog.Logger) (*metricsServer, error) {
	addr, err := listenAddr(addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler(reg, logger))
	logger.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	// A scraper that reads slowly, or not at all, holds its connection
	// and its scrape's goroutine no longer than WriteTimeout.
	return &metricsServer{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}, ln: ln}, nil
}

// serve serves until ctx ends.
func (m *metricsServer) serve(ctx context.Context, logger *slog.Logger) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := m.srv.Serve(m.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("metrics server stopped", "error", err)
		}
	}()
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = m.srv.Shutdown(sctx)
	<-done
}

// metricsHandler serves reg's metrics.
func metricsHandler(reg *prometheus.Registry, logger *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		// An unreachable database fails its statistics, not the rest.
		ErrorHandling: promhttp.ContinueOnError,
		ErrorLog:      slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
		Timeout:       10 * time.Second,
		// Each scrape reads the database's statistics: a burst of
		// scrapes must not take the server's connections.
		MaxRequestsInFlight: 2,
	})
}
