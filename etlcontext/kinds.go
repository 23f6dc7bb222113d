package etlcontext

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	// nil when a release before children: published it (its tasks submit
	// any, as then).
	Children []string `json:"children"`
	// Settings are the kind's whole configuration, for readers.
	Settings json.RawMessage `json:"settings"`
	// PublishedBy names the supervisor that published it last (its host),
	// and Release its release.
	PublishedBy string    `json:"published_by"`
	Release     string    `json:"release"`
	PublishedAt time.Time `json:"published_at"`
}

// PublishKinds records kinds in data_manager.kinds, each replacing what an
// earlier publication of it said, and returns the kinds whose queue,
// attempts, concurrency key or children were published otherwise before: supervisors
// that disagree about a kind submit its tasks differently, which the caller
// says.
func PublishKinds(ctx context.Context, db DB, kinds []PublishedKind) (changed []PublishedKind, err error) {
	var names, queues, fields, settings, by, releases, served, children []string
	var attempts []int32
	for _, k := range kinds {
		s := k.Settings
		if len(s) == 0 {
			s = json.RawMessage("{}")
		}
		q, err := json.Marshal(k.Queues)
		if err != nil || k.Queues == nil {
			q = []byte("[]")
		}
		c, err := json.Marshal(k.Children)
		if err != nil || k.Children == nil {
			c = []byte("[]")
		}
		children = append(children, string(c))
		names, queues, fields, settings = append(names, k.Kind), append(queues, k.Queue), append(fields, k.ConcurrencyKey), append(settings, string(s))
		by, releases, attempts, served = append(by, k.PublishedBy), append(releases, k.Release), append(attempts, int32(k.MaxAttempts)), append(served, string(q))
	}
	// One statement: what it reads of the table is what was there before
	// its insert.
	rows, err := db.Query(ctx, `
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
	changed, err = pgx.CollectRows(rows, scanPublishedKind)
	if err != nil {
		return nil, fmt.Errorf("publish kinds: %w", err)
	}
	return changed, nil
}

func scanPublishedKind(row pgx.CollectableRow) (PublishedKind, error) {
	var k PublishedKind
	err := row.Scan(&k.Kind, &k.Queue, &k.MaxAttempts, &k.ConcurrencyKey, &k.Queues, &k.Children, &k.Settings, &k.PublishedBy, &k.Release, &k.PublishedAt)
	return k, err
}

// Kinds returns the published kinds, by name.
func Kinds(ctx context.Context, db DB) ([]PublishedKind, error) {
	rows, err := db.Query(ctx, `
		SELECT kind, queue, max_attempts, coalesce(concurrency_key, ''), queues, children, settings, published_by, release, published_at
		  FROM data_manager.kinds ORDER BY kind`)
	if err != nil {
		return nil, fmt.Errorf("read published kinds: %w", err)
	}
	kinds, err := pgx.CollectRows(rows, scanPublishedKind)
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
