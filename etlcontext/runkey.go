package etlcontext

import "strconv"

// Through a lock keeper, each statement of a task process runs with its
// session's run key (RunKeySetting): the keeper sends set_config(…, true)
// before it, in its transaction. A few statements of the task process's
// own set the key themselves, as their first step: the keeper knows them
// by their text (KeyParam), fills in their key parameter with the key of
// the session, whatever the task process gave, and sends nothing before
// them. Each sets the key in a MATERIALIZED CTE that it reads before it
// writes or calls anything, for its own transaction only, so that no
// setting an earlier statement left on the keeper's connection counts. On
// a connection of the task process's own the parameter is NULL, and the
// statement keeps the key the session holds.

// selfKeyed maps the text of each statement that sets the key itself to
// the index of its key parameter.
var selfKeyed = map[string]int{}

// keyedBy returns the CTE k, which sets the run's key from parameter n
// (1-based), and registers sql, which follows it, as setting the key
// itself. sql reads k (FROM k, or SELECT count(*) FROM k) before anything
// else.
func keyedBy(n int, sql string) string {
	p := "$" + strconv.Itoa(n)
	// Qualified: a search_path that an earlier statement left on the
	// keeper's connection must not name the functions that see the key.
	sql = `WITH k AS MATERIALIZED (SELECT pg_catalog.set_config('` + RunKeySetting + `', coalesce(` + p + `::text, pg_catalog.current_setting('` +
		RunKeySetting + `', true), ''), true))` + sql
	selfKeyed[sql] = n - 1
	return sql
}

// KeyParam reports whether the statement sql sets the run's key itself,
// and the index of the parameter that holds it.
func KeyParam(sql string) (int, bool) {
	i, ok := selfKeyed[sql]
	return i, ok
}
