package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dama-etl/dama/internal/testenv"
	"github.com/dama-etl/dama/sql"
)

func TestMigrateTwiceAtOnce(t *testing.T) {
	t.Parallel()
	env := testenv.NewUnmigrated(t)
	cfg := env.WriteConfig(sampleConfigFor(10))
	if res := env.Dama(cfg, "submit", "sample"); res.Code == 0 || !strings.Contains(res.Stderr, "not migrated: run dama migrate") {
		t.Fatalf("submit on an unmigrated database: exit %d, stderr %q", res.Code, res.Stderr)
	}
	results := make(chan testenv.Result, 2)
	for range 2 {
		go func() { results <- env.Dama(cfg, "migrate") }()
	}
	var logged []string
	for range 2 {
		res := <-results
		if res.Code != 0 {
			t.Errorf("concurrent dama migrate: exit %d: %s", res.Code, res.Stderr)
		}
		logged = append(logged, strings.Fields(strings.TrimSpace(res.Stderr))...)
	}
	// One line per migration applied, by one or the other.
	var migrations int
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM river_migration) + (SELECT count(*) FROM data_manager.schema_migrations WHERE version_id > 0)`).Scan(&migrations); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Count(strings.Join(logged, " "), "msg=\"applied "); lines != migrations || strings.Count(strings.Join(logged, " "), "time=") != migrations {
		t.Errorf("dama migrate logged %d applied of %d lines, want one line per migration, %d:\n%s", lines, strings.Count(strings.Join(logged, " "), "time="), migrations, strings.Join(logged, " "))
	}
	if res := env.Dama(cfg, "migrate"); res.Code != 0 || res.Stderr != "" {
		t.Errorf("dama migrate on a migrated database: exit %d, stderr %q; want nothing said", res.Code, res.Stderr)
	}
	if res := env.Dama(cfg, "submit", "sample"); res.Code != 0 || testenv.Atoi(t, res.Stdout) != 1 {
		t.Errorf("submit after migrate: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
}

// dama migrate run by a role that may not create roles (the database's
// owner, not an administrator) migrates, and prints the SQL that an
// administrator is to run; once that is run, it prints nothing.
func TestMigrateByAnOwnerPrintsTheRolesForAnAdministrator(t *testing.T) {
	t.Parallel()
	srv := testenv.NewServer(t) // of its own: no test created the roles there
	env := testenv.NewUnmigratedOn(t, srv)
	ctx := context.Background()
	owner := env.NewLogin()
	u, err := url.Parse(owner)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := env.Pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Pool.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s OWNER TO %s`, pgx.Identifier{db}.Sanitize(), pgx.Identifier{u.User.Username()}.Sanitize())); err != nil {
		t.Fatal(err)
	}
	asOwner := []string{"DATABASE_URL=" + owner}
	res := env.DamaWith("", asOwner, "migrate")
	if res.Code != 0 || !strings.Contains(res.Stdout, "Run this as an administrator") || !strings.Contains(res.Stdout, "CREATE ROLE "+sql.RoleReader) {
		t.Fatalf("dama migrate as the owner: exit %d, stdout %q, stderr %q; want the roles' SQL printed", res.Code, res.Stdout, res.Stderr)
	}
	roles := env.Dama("", "roles")
	if roles.Code != 0 || !strings.HasSuffix(res.Stdout, roles.Stdout) {
		t.Errorf("dama roles: exit %d, %q; want what dama migrate printed", roles.Code, roles.Stdout)
	}
	if _, err := env.Pool.Exec(ctx, roles.Stdout); err != nil {
		t.Fatalf("the roles' SQL as an administrator: %v", err)
	}
	if res := env.DamaWith("", asOwner, "migrate"); res.Code != 0 || res.Stdout != "" {
		t.Errorf("dama migrate again: exit %d, stdout %q; want nothing to print", res.Code, res.Stdout)
	}
}
