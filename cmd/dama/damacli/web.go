package damacli

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/dama-etl/dama/cmd/dama/internal/web"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/supervisor"
)

// The environment variables with the action token and the read token: an
// argument would show in a process listing.
const (
	webTokenEnv     = "DAMA_WEB_TOKEN"
	webReadTokenEnv = "DAMA_WEB_READ_TOKEN"
)

func newWebCommand(g *globals) *cobra.Command {
	var (
		listen       string
		readOnly     bool
		publicReads  bool
		allowedHosts []string
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
			token := os.Getenv(webTokenEnv)
			if !readOnly && len(token) < web.MinTokenLength {
				return fmt.Errorf("%w in $%s, or serve the page --read-only", web.ErrNoToken, webTokenEnv)
			}
			// Reads need a token too, unless told otherwise: one made
			// here, handed out in a login link.
			readToken, made := os.Getenv(webReadTokenEnv), false
			if readToken == "" && !publicReads {
				readToken, made = rand.Text(), true
			}
			pool, _, err := connectMigrated(cmd.Context(), 0, withStatementTimeout(web.StatementTimeout))
			if err != nil {
				return err
			}
			defer pool.Close()
			reg := newMetricsRegistry()
			reg.MustRegister(supervisor.NewStatsCollector(pool), supervisor.NewPoolCollector(pool))
			page, err := web.New(pool, cfg, web.Options{
				Token:        token,
				ReadToken:    readToken,
				ReadOnly:     readOnly,
				AllowedHosts: hostsFor(addr, allowedHosts),
				Metrics:      metricsHandler(reg, logger),
				Logger:       logger,
			})
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				return err
			}
			srv := &http.Server{
				Handler:           page,
				ReadHeaderTimeout: 10 * time.Second,
				IdleTimeout:       time.Minute,
				// Requests end with the command: an action's transaction
				// is then rolled back, not left half done.
				BaseContext: func(net.Listener) context.Context { return cmd.Context() },
			}
			logger.Info("serving the status page", "addr", "http://"+ln.Addr().String()+"/", "read_only", readOnly, "public_reads", readToken == "")
			if made {
				// Once, on stderr, not in a log line a collector may keep.
				fmt.Fprintf(cmd.ErrOrStderr(), "Open the status page with this link, which logs the browser in (the token is made anew at each start):\n    http://%s/?%s=%s\n", ln.Addr(), web.LoginParam, readToken)
			}
			return serve(cmd.Context(), srv, ln)
		},
	}
	g.addLogFormat(cmd)
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8080", "address to serve on (a bare :PORT is on localhost)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "serve without actions (else they need $"+webTokenEnv+")")
	cmd.Flags().BoolVar(&publicReads, "public-reads", false, "serve reads to anyone who reaches the page (else they need $"+webReadTokenEnv+", or a token made at start and printed in a login link)")
	cmd.Flags().StringArrayVar(&allowedHosts, "allowed-host", nil, "a host name the page answers to, besides the one it listens on (repeat; against DNS rebinding)")
	return cmd
}

// hostsFor is the Host names a page listening on addr answers to: the
// loopback names, or the address itself, and extra; on a wildcard address
// (0.0.0.0), extra alone (none: any).
func hostsFor(addr string, extra []string) []string {
	host, _, _ := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	switch {
	case host == "localhost" || (ip != nil && ip.IsLoopback()):
		return append([]string{"localhost"}, extra...)
	case host == "" || (ip != nil && ip.IsUnspecified()):
		return extra
	default:
		return append([]string{host}, extra...)
	}
}

// withStatementTimeout sets statement_timeout on each connection of a pool,
// unless DATABASE_URL sets one: with SET after connecting, as PgBouncer
// refuses it as a startup parameter.
func withStatementTimeout(d time.Duration) func(*pgxpool.Config) {
	return func(c *pgxpool.Config) {
		if _, set := c.ConnConfig.RuntimeParams["statement_timeout"]; set || strings.Contains(c.ConnConfig.RuntimeParams["options"], "statement_timeout") {
			return
		}
		next := c.AfterConnect
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			if next != nil {
				if err := next(ctx, conn); err != nil {
					return err
				}
			}
			// A number of dama's own, not a parameter: SET takes none.
			if _, err := conn.Exec(ctx, "SET statement_timeout = "+strconv.FormatInt(d.Milliseconds(), 10)); err != nil {
				return fmt.Errorf("set statement_timeout: %w", err)
			}
			return nil
		}
	}
}
