package damacli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
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

// newMetricsRegistry is a registry with the Go runtime's and the process's metrics.
func newMetricsRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// serveMetrics serves reg's metrics on http://addr/metrics, and on
// http://addr/ready whether ready is closed, until stop is called. It
// listens at once, so that a bad address is an error before anything else
// starts.
func serveMetrics(addr string, reg *prometheus.Registry, ready <-chan struct{}, logger *slog.Logger) (stop func(), err error) {
	if addr, err = listenAddr(addr); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen for metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metricsHandler(reg, logger))
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-ready:
			fmt.Fprintln(w, "ready")
		default:
			http.Error(w, "not ready: it waits for the database, or is starting", http.StatusServiceUnavailable)
		}
	})
	logger.Info("serving metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	// A scraper that reads slowly, or not at all, holds its connection
	// and its scrape's goroutine no longer than WriteTimeout.
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := serve(ctx, srv, ln); err != nil {
			logger.Error("metrics server stopped", "error", err)
		}
	}()
	return sync.OnceFunc(func() {
		cancel()
		<-served
	}), nil
}

// serve serves srv on ln until ctx ends, then shuts it down, giving the
// requests under way 5s to finish.
func serve(ctx context.Context, srv *http.Server, ln net.Listener) error {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	<-stopped
	return nil
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
