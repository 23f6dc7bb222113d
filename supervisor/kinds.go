package supervisor

import (
	"context"
	"fmt"
	"time"

	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/version"
)

// publishLoop publishes the configuration's kinds again, every
// poll_interval, until the database takes them: a supervisor that could not
// at its start (err) runs its tasks all the same.
func (s *Supervisor) publishLoop(ctx context.Context, err error) {
	for err != nil {
		s.logger.Warn("publish kinds; data_manager.submit refuses those no supervisor published until then", "error", err, "retry_in", s.cfg.PollInterval)
		if !sleep(ctx, time.Duration(s.cfg.PollInterval)) {
			return
		}
		err = s.publishKinds(ctx)
	}
}

// publishKinds records the configuration's kinds in data_manager.kinds,
// which data_manager.submit submits, and says which of them another
// supervisor had published otherwise: until they agree, a task's settings
// depend on who published last.
func (s *Supervisor) publishKinds(ctx context.Context) error {
	var kinds []etlcontext.PublishedKind
	for _, name := range s.cfg.KindNames() {
		k := s.cfg.Kinds[name]
		settings, err := k.Settings()
		if err != nil {
			return err
		}
		// As the database can store them: a NUL in a command's argument
		// (which no exec takes) becomes U+FFFD.
		if settings, _, err = etlcontext.CleanJSON(settings); err != nil {
			return fmt.Errorf("encode the settings of kind %s: %w", name, err)
		}
		kinds = append(kinds, etlcontext.PublishedKind{
			Kind: name, Queue: k.Queue, MaxAttempts: k.MaxAttempts, ConcurrencyKey: k.ConcurrencyKey, Queues: s.cfg.QueueNames(),
			Children: k.Children, Settings: settings, PublishedBy: s.host, Release: version.Release,
		})
	}
	changed, err := etlcontext.PublishKinds(ctx, s.pool, kinds)
	if err != nil {
		return err
	}
	for _, k := range changed {
		now := s.cfg.Kinds[k.Kind]
		s.logger.Warn("kind published otherwise before; now as this configuration says", "kind", k.Kind,
			"queue", now.Queue, "max_attempts", now.MaxAttempts, "concurrency_key", now.ConcurrencyKey, "children", now.Children,
			"was_queue", k.Queue, "was_max_attempts", k.MaxAttempts, "was_concurrency_key", k.ConcurrencyKey, "was_children", k.Children,
			"was_published_by", k.PublishedBy, "was_release", k.Release, "was_published_at", k.PublishedAt)
	}
	return nil
}
