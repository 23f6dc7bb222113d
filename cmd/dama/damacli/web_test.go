package damacli

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama/internal/testenv"
)

// TestHostsFor: the Host names a page answers to follow its address.
func TestHostsFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		addr  string
		extra []string
		want  string
	}{
		{"127.0.0.1:8080", nil, "[localhost]"},
		{"[::1]:8080", []string{"dama.internal"}, "[localhost dama.internal]"},
		{"10.1.2.3:8080", nil, "[10.1.2.3]"},
		{"0.0.0.0:8080", nil, "[]"},
		{"0.0.0.0:8080", []string{"dama.example.com"}, "[dama.example.com]"},
	} {
		if got := fmt.Sprint(hostsFor(c.addr, c.extra)); got != c.want {
			t.Errorf("hostsFor(%s, %v) = %s, want %s", c.addr, c.extra, got, c.want)
		}
	}
}

// The page's statements time out on the server (a request given up on
// stops its statement there too), unless DATABASE_URL says otherwise.
func TestThePagesStatementsTimeOut(t *testing.T) {
	t.Parallel()
	env := testenv.New(t)
	ctx := context.Background()
	for url, want := range map[string]string{env.URL: "30s", env.URL + "&options=-c%20statement_timeout%3D5s": "5s"} {
		pcfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		withStatementTimeout(30 * time.Second)(pcfg)
		pool, err := pgxpool.NewWithConfig(ctx, pcfg)
		if err != nil {
			t.Fatal(err)
		}
		var got string
		err = pool.QueryRow(ctx, `SHOW statement_timeout`).Scan(&got)
		pool.Close()
		if err != nil || got != want {
			t.Errorf("%s: statement_timeout %q (%v), want %s", url, got, err, want)
		}
	}
}
