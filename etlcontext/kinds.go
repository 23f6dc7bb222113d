package etlcontext

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// PublishedKind is a row of data_manager.kinds: a kind as a supervisor
// published it, which data_manager.submit then submits.
type PublishedKind struct {
	Kind        string `json:"kind"`
	Queue       string `json:"queue"`
	MaxAttempts int    `json:"max_attempts"`
	// ConcurrencyKey is the field of the arguments that is a task's
	// concurrency key; empty for none.
	ConcurrencyKey string `json:"concurrency_key,omitempty"`
	// Queues are the queues the publishing supervisor serves: those a
	// submission of the kind may name instead of Queue.
	Queues []string `json:"queues"`
	// Children are the kinds its tasks may submit as children, in order;
	// nil, when a release before children: published it, for any.
	Children []string `json:"children"`
	// Settings are the kind's whole configuration, for readers.
	Settings json.RawMessage `json:"settings"`
	// PublishedBy names the supervisor that published it last (its host).
	PublishedBy string    `json:"published_by"`
	Release     string    `json:"release"`
	PublishedAt time.Time `json:"published_at"`
}

// PublishKinds records kinds in data_manager.kinds, each replacing what an
// earlier publication of it said, and returns the kinds whose queue,
// attempts, concurrency key or children were published otherwise before,
// for the caller to say: supervisors that disagree about a kind submit its
// tasks differently.
func PublishKinds(ctx context.Context, db DB, kinds []PublishedKind) (changed []PublishedKind, err error) {
	var names, queues, fields, settings, by, releases, served, children []string
	var attempts []int32
	for _, k := range kinds {
		names, queues, fields = append(names, k.Kind), append(queues, k.Queue), append(fields, k.ConcurrencyKey)
		settings = append(settings, cmp.Or(string(k.Settings), "{}"))
		by, releases, attempts = append(by, k.PublishedBy), append(releases, k.Release), append(attempts, int32(k.MaxAttempts))
		served, children = append(served, jsonList(k.Queues)), append(children, jsonList(k.Children))
	}
	// One statement: what it reads of the table is what was there before
	// its insert.
	changed, err = collect[PublishedKind](ctx, db, `
		WITH new AS (
		    SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::jsonb[], $6::text[], $7::text[], $8::jsonb[], $9::jsonb[])
		        AS n(kind, queue, max_attempts, concurrency_key, settings, published_by, release, queues, children)
		), published AS (
		    INSERT INTO data_manager.kinds AS k (kind, queue, max_attempts, concurrency_key, queues, children, settings, published_by, release)
		    SELECT kind, queue, max_attempts, nullif(concurrency_key, ''), ARRAY(SELECT jsonb_array_elements_text(queues)),
		           ARRAY(SELECT c FROM jsonb_array_elements_text(children) AS c ORDER BY c), settings, published_by, release FROM new
		    ON CONFLICT (kind) DO UPDATE SET queue = excluded.queue, max_attempts = excluded.max_attempts,
		        concurrency_key = excluded.concurrency_key, queues = excluded.queues, children = excluded.children,
		        settings = excluded.settings, published_by = excluded.published_by, release = excluded.release, published_at = now()
		)
		SELECT k.kind, k.queue, k.max_attempts, coalesce(k.concurrency_key, ''), k.queues, k.children, k.settings, k.published_by, k.release, k.published_at
		  FROM data_manager.kinds AS k JOIN new AS n ON n.kind = k.kind
		 WHERE (k.queue, k.max_attempts, coalesce(k.concurrency_key, '')) IS DISTINCT FROM (n.queue, n.max_attempts, n.concurrency_key)
		    OR k.children IS DISTINCT FROM ARRAY(SELECT c FROM jsonb_array_elements_text(n.children) AS c ORDER BY c) AND k.children IS NOT NULL
		 ORDER BY k.kind`, names, queues, attempts, fields, settings, by, releases, served, children)
	if err != nil {
		return nil, fmt.Errorf("publish kinds: %w", err)
	}
	return changed, nil
}

// jsonList is list as a JSON array, [] for nil.
func jsonList(list []string) string {
	if list == nil {
		return "[]"
	}
	b, _ := json.Marshal(list) // a []string always encodes
	return string(b)
}

// Kinds returns the published kinds, by name.
func Kinds(ctx context.Context, db DB) ([]PublishedKind, error) {
	kinds, err := collect[PublishedKind](ctx, db, `
		SELECT kind, queue, max_attempts, coalesce(concurrency_key, ''), queues, children, settings, published_by, release, published_at
		  FROM data_manager.kinds ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("read published kinds: %w", err)
	}
	return kinds, nil
}

// Published reports whether a supervisor published kind.
func Published(ctx context.Context, db DB, kind string) (bool, error) {
	var published bool
	if err := db.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM data_manager.kinds WHERE kind = $1)`, kind).Scan(&published); err != nil {
		return false, fmt.Errorf("look for published kind %s: %w", kind, err)
	}
	return published, nil
}
