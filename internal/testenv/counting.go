package testenv

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// queryCounter counts the statements containing sql that go through the
// connections it traces.
type queryCounter struct {
	sql string
	n   atomic.Int64
}

func (c *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, c.sql) {
		c.n.Add(1)
	}
	return ctx
}

func (c *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// CountingPool returns a pool of env's database and the count of its
// statements containing sql, so that a test can bound the work a flood
// causes.
func CountingPool(t testing.TB, env *Env, sql string) (*pgxpool.Pool, *atomic.Int64) {
	t.Helper()
	pcfg, err := pgxpool.ParseConfig(env.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := &queryCounter{sql: sql}
	pcfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(context.Background(), pcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, &c.n
}
