package supervisor

import (
	"context"
	"errors"
	"time"

	"github.com/dama-etl/dama/etlcontext"
)

// wakeWaiting wakes the parked jobs of the queue's due tasks that wait for
// a slot and would find one now, the kinds taking turns
// (etlcontext.WakeWaitingJobs). It is also the backstop, every poll
// interval, for a wake-up that came while a task's step was still parking
// it. Wake-ups of one queue are coalesced: while one runs, those asked for
// meanwhile (500 tasks ending at once) make it run once more.
func (s *Supervisor) wakeWaiting(ctx context.Context, queue string) {
	s.mu.Lock()
	if _, running := s.waking[queue]; running {
		s.waking[queue] = true
		s.mu.Unlock()
		return
	}
	s.waking[queue] = false
	s.mu.Unlock()
	for again := true; again; {
		s.wakeOnce(ctx, queue)
		s.mu.Lock()
		if again = s.waking[queue]; again {
			s.waking[queue] = false
		} else {
			delete(s.waking, queue)
		}
		s.mu.Unlock()
	}
}

// wakeOnce is one wake-up of the queue's waiting tasks.
func (s *Supervisor) wakeOnce(ctx context.Context, queue string) {
	q, ok := s.cfg.Queues[queue]
	if !ok {
		return
	}
	room := etlcontext.QueueRoom{Queue: queue, MaxRunning: q.MaxRunning, Kinds: s.cfg.KindNames()}
	room.KindMax, room.KindKeyMax = make([]int32, len(room.Kinds)), make([]int32, len(room.Kinds))
	for i, name := range room.Kinds {
		k, _ := s.cfg.Kind(name)
		room.KindMax[i], room.KindKeyMax[i] = int32(k.MaxRunning), int32(k.MaxRunningPerKey)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := etlcontext.WakeWaitingJobs(ctx, s.pool, room)
	if err != nil {
		// The backstop tries again at the next poll interval.
		if !errors.Is(err, context.Canceled) {
			s.logger.Warn("wake tasks waiting for a slot", "queue", queue, "error", err)
		}
		return
	}
	if n > 0 {
		s.notifyQueue(ctx, queue)
	}
}
