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
// owner, not an administrator) migrates, and says in two lines that the
// roles are optional and how to add them later: dama roles, run by a role
// that may create roles. Once they are in place, it says nothing.
func TestMigrateByAnOwnerSaysHowToAddTheRoles(t *testing.T) {
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
	var said []string // what it says beside its log's line per migration
	for line := range strings.Lines(res.Stderr) {
		if !strings.Contains(line, `msg="applied `) {
			said = append(said, line)
		}
	}
	if res.Code != 0 || res.Stdout != "" || len(said) > 2 || !strings.Contains(res.Stderr, "optional") || !strings.Contains(res.Stderr, "run dama roles") {
		t.Fatalf("dama migrate as the owner: exit %d, stdout %q, stderr %q; want two lines that say the roles are optional and to run dama roles", res.Code, res.Stdout, said)
	}
	if res := env.DamaWith("", asOwner, "roles"); res.Code == 0 || strings.Count(res.Stderr, "\n") != 1 || !strings.Contains(res.Stderr, "may not create roles") {
		t.Errorf("dama roles as the owner: exit %d, stderr %q; want one line that says it may not create roles", res.Code, res.Stderr)
	}
	if res := env.Dama("", "roles"); res.Code != 0 || !strings.Contains(res.Stdout, "dama's roles are in place") {
		t.Fatalf("dama roles as an administrator: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	if err := sql.CheckRoles(ctx, env.Pool); err != nil {
		t.Errorf("after dama roles: %v", err)
	}
	// The same, as SQL for an administrator's psql.
	roles := env.Dama("", "roles", "--sql")
	if roles.Code != 0 || !strings.Contains(roles.Stdout, "CREATE ROLE "+sql.RoleReader) {
		t.Fatalf("dama roles --sql: exit %d, %q", roles.Code, roles.Stdout)
	}
	if _, err := env.Pool.Exec(ctx, roles.Stdout); err != nil {
		t.Fatalf("the roles' SQL as an administrator: %v", err)
	}
	if res := env.DamaWith("", asOwner, "migrate"); res.Code != 0 || res.Stdout != "" || res.Stderr != "" {
		t.Errorf("dama migrate again: exit %d, stdout %q, stderr %q; want nothing said", res.Code, res.Stdout, res.Stderr)
	}
}
