package etlcontext

import (
	"context"
	"fmt"
	"time"
)

// Supervisor is a row of data_manager.dama_supervisors: a supervisor, what
// it serves, and whether it serves now (migration 36). One of a release
// before that serves what is unknown: its PID, Release, LockModes, Queues,
// Kinds, PodKinds and HostID are nil.
type Supervisor struct {
	// State is SupervisorServing while its liveness lock is held (or
	// SupervisorUnresponsive once it was not seen for 90 s), then
	// SupervisorStopped once it stopped, or SupervisorLost.
	State     string   `json:"state"`
	Host      string   `json:"host"`
	PID       *int     `json:"pid"`
	Release   *string  `json:"release"`
	LockModes []string `json:"lock_modes"`
	Queues    []string `json:"queues"`
	Kinds     []string `json:"kinds"`
	// PodKinds are those of Kinds whose tasks run in pods of their own.
	PodKinds []string `json:"pod_kinds"`
	// Running counts the tasks running on its host in its queues, and of
	// its PodKinds, while its session lives; nil once it does not.
	Running   *int      `json:"running"`
	StartedAt time.Time `json:"started_at"`
	// LastSeenAt is when it was last seen to serve (every 30 s).
	LastSeenAt time.Time  `json:"last_seen_at"`
	StoppedAt  *time.Time `json:"stopped_at"`
	ClientID   string     `json:"client_id"`
	HostID     *string    `json:"host_id"`
}

// The states of a supervisor: serving, unresponsive (its session lives,
// but it was not seen for 90 s: stopped by SIGSTOP, or stuck), stopped
// (cleanly), or lost (killed, or cut off from the database).
const (
	SupervisorServing      = "SERVING"
	SupervisorUnresponsive = "UNRESPONSIVE"
	SupervisorStopped      = "STOPPED"
	SupervisorLost         = "LOST"
)

// supervisorsKept is how long a supervisor's row outlives its last sighting.
const supervisorsKept = 24 * time.Hour

// SupervisorServes records that s serves now: as it starts, once it holds
// its liveness lock, and then every little while. It removes the rows of
// supervisors not seen for a day, and those of its host that no longer
// serve: a supervisor restarted in a loop leaves one.
func SupervisorServes(ctx context.Context, db DB, s Supervisor) error {
	_, err := db.Exec(ctx, `
		WITH gone AS (
		    DELETE FROM data_manager.supervisors
		     WHERE last_seen_at < now() - $9::interval
		        OR client_id IN (SELECT v.client_id FROM data_manager.dama_supervisors AS v
		                          WHERE v.host_id = $3 AND v.client_id <> $1 AND v.state IN ('`+SupervisorStopped+`', '`+SupervisorLost+`'))
		)
		INSERT INTO data_manager.supervisors (client_id, host, host_id, pid, release, lock_modes, queues, kinds, pod_kinds)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $10)
		ON CONFLICT (client_id) DO UPDATE SET last_seen_at = now()`,
		s.ClientID, s.Host, s.HostID, s.PID, s.Release, s.LockModes, s.Queues, s.Kinds, supervisorsKept, s.PodKinds)
	if err != nil {
		return fmt.Errorf("record this supervisor in data_manager.supervisors: %w", err)
	}
	return nil
}

// SupervisorStops records that supervisor clientID stops serving.
func SupervisorStops(ctx context.Context, db DB, clientID string) error {
	_, err := db.Exec(ctx, `
		UPDATE data_manager.supervisors SET last_seen_at = now(), stopped_at = now() WHERE client_id = $1`, clientID)
	if err != nil {
		return fmt.Errorf("record this supervisor as stopped: %w", err)
	}
	return nil
}

// Supervisors reads data_manager.dama_supervisors: those serving first,
// then the unresponsive, then the others, the last seen first.
func Supervisors(ctx context.Context, db DB) ([]Supervisor, error) {
	sups, err := collect[Supervisor](ctx, db, `
		SELECT state, host, pid, release, lock_modes, queues, kinds, pod_kinds, running, started_at, last_seen_at,
		       stopped_at, client_id, host_id
		  FROM data_manager.dama_supervisors
		 ORDER BY state = '`+SupervisorServing+`' DESC, state = '`+SupervisorUnresponsive+`' DESC, last_seen_at DESC, started_at DESC`)
	if err != nil {
		return nil, fmt.Errorf("read data_manager.dama_supervisors: %w", err)
	}
	return sups, nil
}
