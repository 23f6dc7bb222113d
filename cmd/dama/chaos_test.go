package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dama-etl/dama"
	"github.com/dama-etl/dama/config"
	"github.com/dama-etl/dama/etlcontext"
	"github.com/dama-etl/dama/internal/testenv"
)

func TestChaosNoOverlapWhateverIsKilledOrRestarted(t *testing.T) {
	testenv.LockModes(t, testChaosNoOverlapWhateverIsKilledOrRestarted)
}

func testChaosNoOverlapWhateverIsKilledOrRestarted(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("DAMA_CHAOS_SEED"); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("DAMA_CHAOS_SEED=%q: %v", s, err)
		}
	}
	t.Logf("chaos seed %d (set DAMA_CHAOS_SEED to replay)", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	began := time.Now()

	// The database has a synchronous streaming replica, and everyone
	// names both: once in the chaos the primary crashes and the replica
	// takes over; srv is the primary of the moment.
	srv := testenv.NewServer(t)
	replica := testenv.NewReplica(t, srv)
	base := testenv.NewOn(t, srv)
	// Where every concurrent path runs, the race detector watches.
	base.WithRaceDetector()
	dbURL := testenv.FailoverURL(t, base.URL, srv, replica)
	viaBoth := []string{"DATABASE_URL=" + dbURL}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	env := &testenv.Env{T: base.T, URL: base.URL, Pool: pool, Dir: base.Dir, DamaBin: base.DamaBin, SampleETL: base.SampleETL, SampleEmbedded: base.SampleEmbedded, Server: base.Server}
	failoverRound := 2 + rng.IntN(chaosRounds-4)
	failedOver := false
	script := filepath.Join(env.Dir, "chaos.sh")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(chaosScript, "{{dir}}", env.Dir)), 0o755); err != nil {
		t.Fatal(err)
	}
	w := &beatWorld{Env: env, cfg: env.WriteConfig(fmt.Sprintf(chaosConfig, chaosReconnectGrace))}
	startSupervisor := func() *testenv.Proc { return env.StartWith(w.cfg, viaBoth, nil, "supervisor") }
	// On failure, what the commands and task processes of the contexts
	// involved wrote (registered after NewOn: it runs before Dir is removed).
	suspects := map[int64]bool{}
	t.Cleanup(func() {
		if t.Failed() {
			for id := range suspects {
				logTail, _ := os.ReadFile(filepath.Join(env.Dir, "logs", fmt.Sprintf("%d.log", id)))
				t.Logf("context %d: starts %v; beats per attempt %v; events:\n%s\nits log:\n%s", id, w.starts(id), beatSpans(w.beats(id)), chaosEvents(pool, id), lastBytes(logTail, 8<<10))
			}
		}
	})

	cfg, err := config.Load(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	client, err := dama.NewClient(env.Pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for range chaosTasks {
		id, _, err := client.Submit(context.Background(), dama.SubmitParams{Kind: "chaos"})
		if err != nil {
			t.Fatalf("seed %d: submit: %v", seed, err)
		}
		ids = append(ids, id)
	}
	sups := []*testenv.Proc{startSupervisor(), startSupervisor()}

	// query runs one statement with a deadline of its own; during or right
	// after an outage it fails, and the caller skips what needed it.
	query := func(sql string, scan func(row interface{ Scan(...any) error }) error, args ...any) error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		rows, err := env.Pool.Query(ctx, sql, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := scan(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	}
	// running lists the attempts that are RUNNING now, with the pid of the
	// task process when it recorded one (0 otherwise), its run id, whether
	// it holds its lock (it may be taking it again after a restart) and how
	// many attempts of the context failed so far.
	type runningTask struct {
		chaosAttempt
		pid      int
		ticks    uint64
		runID    string
		locked   bool
		failures int
	}
	running := func() ([]runningTask, error) {
		var out []runningTask
		err := query(`
			SELECT q.etl_context_id, q.attempt, coalesce(q.pid, 0),
			       coalesce((SELECT c.runner_start_ticks FROM data_manager.etl_contexts c WHERE c.etl_context_id = q.etl_context_id), 0),
			       coalesce(q.run_id::text, ''), q.initial_event_locked,
			       (SELECT count(*) FROM data_manager.event_store e
			         WHERE e.etl_context_id = q.etl_context_id AND e.type = 'chaos:ERROR')
			  FROM data_manager.dama_task_queue q
			 WHERE q.etl_status = 'RUNNING'
			 ORDER BY q.etl_context_id`, func(row interface{ Scan(...any) error }) error {
			var r runningTask
			if err := row.Scan(&r.id, &r.attempt, &r.pid, &r.ticks, &r.runID, &r.locked, &r.failures); err != nil {
				return err
			}
			out = append(out, r)
			return nil
		})
		return out, err
	}
	// aliveDuring returns the attempts whose task process ran at some
	// moment from from to to: what a fault in that span hit, also an
	// attempt launched between the look at what runs and the moment the
	// fault struck (pg_ctl stop took 7.5 s to begin on a busy machine).
	aliveDuring := func(from, to time.Time) []chaosAttempt {
		var out []chaosAttempt
		// Right after the fault, the pool may first meet its dead
		// connections.
		testenv.Eventually(t, time.Minute, "the attempts alive during the fault to be read", func() (bool, error) {
			out = nil
			err := query(`
				SELECT etl_context_id, attempt FROM data_manager.etl_attempts
				 WHERE started_at <= $2 AND (ended_at IS NULL OR ended_at >= $1)`, func(row interface{ Scan(...any) error }) error {
				var a chaosAttempt
				if err := row.Scan(&a.id, &a.attempt); err != nil {
					return err
				}
				out = append(out, a)
				return nil
			}, from, to)
			return err == nil, err
		})
		return out
	}
	// relockSlack is the time a task process may take, once the server
	// is back, to take its lock again: chaosRelockSlack, and two
	// connections as long as the test's own takes right then, among
	// every task process's (a CI host took 4.6 s past a promotion).
	relockSlack := func() time.Duration {
		var took time.Duration
		testenv.Eventually(t, time.Minute, "a connection to the server that is back", func() (bool, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			start := time.Now()
			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				return false, err
			}
			defer conn.Close(context.Background())
			if _, err := conn.Exec(ctx, "SELECT 1"); err != nil {
				return false, err
			}
			took = time.Since(start)
			return true, nil
		})
		return chaosRelockSlack + 2*took
	}
	// sparedFrom names the running tasks that failed chaosMaxFailures
	// attempts already: no fault that fails attempts may hit them.
	sparedFrom := func(tasks []runningTask) []int64 {
		var spared []int64
		for _, task := range tasks {
			if task.failures >= chaosMaxFailures {
				spared = append(spared, task.id)
			}
		}
		return spared
	}
	// A task is settled DONE with its job completed, or CANCELLED (by an
	// operator) with its job cancelled. A running job of an unsettled
	// task also names the client that fetched it, when, and whether that
	// client's liveness lock is held: a step nobody rescues is told from
	// one whose supervisor died (one field each, for the count).
	unsettled := func() (string, error) {
		var summary []string
		err := query(`
			SELECT q.etl_context_id || ':' || q.etl_status || '/' || coalesce(q.job_state, '-') || '@' || q.attempt
			       || CASE WHEN j.state = 'running' THEN
			            '[' || coalesce(j.attempted_by[array_length(j.attempted_by, 1)], '?') || '@'
			                || to_char(j.attempted_at, 'HH24:MI:SS.MS') || ','
			                || CASE WHEN EXISTS (
			                     SELECT 1 FROM pg_catalog.pg_locks AS l
			                      WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
			                        AND l.classid = $1::oid
			                        AND l.objid = hashtext(j.attempted_by[array_length(j.attempted_by, 1)])::oid
			                        AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database()))
			                   THEN 'live' ELSE 'dead' END || ']'
			          ELSE '' END
			  FROM data_manager.dama_task_queue AS q
			  LEFT JOIN river_job AS j ON j.id = q.river_job_id
			 WHERE NOT ((q.etl_status = 'DONE' AND q.job_state IS NOT DISTINCT FROM 'completed')
			         OR (q.etl_status = 'CANCELLED' AND q.job_state IS NOT DISTINCT FROM 'cancelled'))
			 ORDER BY q.etl_context_id`, func(row interface{ Scan(...any) error }) error {
			var s string
			summary = append(summary, s)
			return row.Scan(&summary[len(summary)-1])
		}, etlcontext.ClientLockNamespace)
		return strings.Join(summary, " "), err
	}

	// What each fault hit, to tell the failed attempts it explains.
	var (
		counts       = map[string]int{}
		skipped      = map[string]int{}
		runnerKilled = map[chaosAttempt]int64{} // when, in unix ns
		outageHit    = map[chaosAttempt]bool{}
		restartHit   = map[chaosAttempt]bool{}
		outages      int
	)
	rounds := 0
	// note logs what a round did, on a timeline from the test's start.
	note := func(format string, args ...any) {
		t.Logf("round %2d +%6.2fs: %s", rounds+1, time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	skip := func(what, why string) {
		skipped[what]++
		note("%s skipped: %s", what, why)
	}
	// lift ends the pause or block an operator began in the last round,
	// once liftIn more gaps passed (one or two, at random); nil when none
	// holds.
	var (
		lift   func()
		liftIn int
	)
	// operate is an operator's action at a random moment: cancel a task
	// (without waiting for it to stop), retry a cancelled one, or pause the
	// queue or block the kind for a round or two.
	operate := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		hold := func(what string, on, off func(context.Context) error) {
			if lift != nil {
				skip(what, "another pause or block holds")
				return
			}
			if err := on(ctx); err != nil {
				skip(what, err.Error())
				return
			}
			since := time.Now()
			liftIn = 1 + rng.IntN(2)
			lift = func() {
				// Lifted for sure, if not now then at the end of the chaos.
				offCtx, offCancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer offCancel()
				if err := off(offCtx); err != nil {
					note("%s: lifting failed (%v); lifted at the end", what, err)
				}
				counts[what]++
				note("%s for %s", what, time.Since(since).Round(time.Millisecond))
			}
		}
		switch r := rng.IntN(100); {
		case r < 40:
			id := ids[rng.IntN(len(ids))]
			status, err := client.RequestCancel(ctx, id)
			if err != nil {
				skip("cancel", err.Error())
				return
			}
			counts["cancel"]++
			note("cancel of context %d requested (it was %s)", id, status)
		case r < 65:
			var cancelled []int64
			if err := query(`SELECT etl_context_id FROM data_manager.etl_contexts WHERE etl_status = 'CANCELLED' ORDER BY 1`,
				func(row interface{ Scan(...any) error }) error {
					var id int64
					err := row.Scan(&id)
					cancelled = append(cancelled, id)
					return err
				}); err != nil || len(cancelled) == 0 {
				skip("retry", fmt.Sprintf("no cancelled task (%v)", err))
				return
			}
			id := cancelled[rng.IntN(len(cancelled))]
			if err := client.Retry(ctx, id); err != nil {
				skip("retry", err.Error())
				return
			}
			counts["retry"]++
			note("context %d retried", id)
		case r < 82:
			hold("pause", func(ctx context.Context) error {
				_, err := client.PauseQueue(ctx, "etl", "chaos")
				return err
			}, func(ctx context.Context) error {
				_, err := client.ResumeQueue(ctx, "etl")
				return err
			})
		default:
			hold("block", func(ctx context.Context) error {
				_, err := client.BlockKind(ctx, "chaos", "chaos")
				return err
			}, func(ctx context.Context) error {
				_, err := client.UnblockKind(ctx, "chaos")
				return err
			})
		}
	}
	// After the last round, more gaps while an operator's pause or block
	// holds: it lasts its gaps, as in any other round.
	for ; rounds < chaosRounds || lift != nil; rounds++ {
		time.Sleep(chaosRoundGap) // deliberately: the rhythm of the faults, whose gaps an operator's pause or block lasts
		if liftIn--; lift != nil && liftIn <= 0 {
			lift()
			lift = nil
		}
		if rounds >= chaosRounds {
			continue
		}
		if open, err := unsettled(); err == nil && open == "" {
			if lift != nil {
				lift()
				lift = nil
			}
			break
		}
		r := rng.IntN(100)
		switch {
		case rounds == failoverRound && !failedOver:
			// The primary crashes; its synchronous replica is promoted.
			tasks, _ := running()
			for _, task := range tasks {
				restartHit[task.chaosAttempt] = true
			}
			start := time.Now()
			srv.Stop(t, "immediate")
			replica.Promote(t)
			srv, failedOver = replica, true
			took := time.Since(start)
			// A busy machine took 14.5 s to promote: past the grace, as a
			// long restart is, the attempts it hit may fail.
			slack := relockSlack()
			long := took+slack > chaosReconnectGrace
			// Up to the promotion: an attempt launched after is not hit.
			for _, a := range aliveDuring(start, start.Add(took)) {
				restartHit[a] = true
				outageHit[a] = outageHit[a] || long
			}
			counts["failover"]++
			note("primary crashed, replica promoted in %s (past reconnect_grace %s less %s: %t), %d tasks running", took.Round(time.Millisecond), chaosReconnectGrace, slack.Round(time.Millisecond), long, len(tasks))
		case r < 20:
			operate()
		case r < 40:
			// A supervisor crashes (its whole process group) and a new one
			// takes its place.
			i := rng.IntN(len(sups))
			old := sups[i].Cmd.Process.Pid
			_ = syscall.Kill(-old, syscall.SIGKILL)
			_ = sups[i].Wait()
			sups[i] = startSupervisor()
			counts["supervisor kill"]++
			note("supervisor %d (pid %d) killed, replaced by pid %d", i, old, sups[i].Cmd.Process.Pid)
		case r < 70:
			// A task process crashes, holding its lock or taking it again
			// after a restart; its command's worker lives on.
			tasks, err := running()
			if err != nil {
				skip("runner kill", err.Error())
				continue
			}
			var victims []runningTask
			for _, task := range tasks {
				if task.pid != 0 && task.failures < chaosMaxFailures && isTaskrunner(task.pid, task.ticks) {
					victims = append(victims, task)
				}
			}
			if len(victims) == 0 {
				skip("runner kill", fmt.Sprintf("no live task process of a context with fewer than %d failures: running (id attempt pid run locked failures) %v", chaosMaxFailures, tasks))
				continue
			}
			v := victims[rng.IntN(len(victims))]
			if err := syscall.Kill(v.pid, syscall.SIGKILL); err != nil {
				skip("runner kill", err.Error())
				continue
			}
			runnerKilled[v.chaosAttempt] = time.Now().UnixNano()
			counts["runner kill"]++
			note("task process %d of context %d attempt %d killed (holding its lock: %t; %d running)", v.pid, v.id, v.attempt, v.locked, len(tasks))
		case r < 90 || outages >= chaosMaxOutages:
			// The server restarts within reconnect_grace.
			d := chaosMinRestart + time.Duration(rng.Int64N(int64(chaosMaxRestart-chaosMinRestart)))
			tasks, err := running()
			if err != nil {
				skip("server restart", err.Error())
				continue
			}
			// On a busy machine pg_ctl may make it a long outage, which
			// fails attempts: spared as a long outage spares them.
			if spared := sparedFrom(tasks); len(spared) > 0 {
				skip("server restart", fmt.Sprintf("contexts %v failed %d attempts already", spared, chaosMaxFailures))
				continue
			}
			for _, task := range tasks {
				restartHit[task.chaosAttempt] = true
			}
			from := time.Now()
			outage := srv.Restart(t, d)
			slack := relockSlack()
			// Up to the server's return, not pg_ctl's: an attempt
			// launched after is not hit.
			hit := aliveDuring(from, from.Add(outage.Down))
			for _, a := range hit {
				restartHit[a] = true
			}
			counts["server restart"]++
			// pg_ctl takes its own time, 11–35 s on a busy machine: a
			// restart whose outage, with a moment to take the lock again,
			// passed reconnect_grace is a long outage for the attempts it
			// hit, which may fail (and must not overlap).
			if outage.Down+slack > chaosReconnectGrace {
				for _, a := range hit {
					outageHit[a] = true
				}
				counts["server restart past the grace"]++
				note("server restarted for %s: %s, past reconnect_grace %s less %s to take a lock again: a long outage, %d tasks running", d.Round(time.Millisecond), outage, chaosReconnectGrace, slack.Round(time.Millisecond), len(tasks))
				break
			}
			note("server restarted for %s: %s, %d tasks running", d.Round(time.Millisecond), outage, len(tasks))
		default:
			// The server stays away for longer than any task can wait: every
			// command is stopped before it comes back.
			tasks, err := running()
			if err != nil {
				skip("long outage", err.Error())
				continue
			}
			if spared := sparedFrom(tasks); len(spared) > 0 {
				skip("long outage", fmt.Sprintf("contexts %v failed %d attempts already", spared, chaosMaxFailures))
				continue
			}
			var hit []chaosAttempt
			for _, task := range tasks {
				outageHit[task.chaosAttempt] = true
				hit = append(hit, task.chaosAttempt)
			}
			from := time.Now()
			srv.Stop(t, "fast")
			time.Sleep(chaosOutage) // deliberately: the outage is the fault
			outage := srv.Start(t)
			for _, a := range aliveDuring(from, from.Add(outage.Down)) {
				outageHit[a] = true
			}
			outages++
			counts["long outage"]++
			note("server stopped for %s: %s, running: %v", chaosOutage, outage, hit)
		}
	}
	// The operator lifts what holds tasks back.
	testenv.Eventually(t, time.Minute, "the queue resumed and the kind unblocked", func() (bool, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		if _, err := client.ResumeQueue(ctx, "etl"); err != nil {
			return false, err
		}
		_, err := client.UnblockKind(ctx, "chaos")
		return err == nil, err
	})
	chaosEnded := time.Now()
	t.Logf("chaos: %d rounds in %s: %v; skipped: %v",
		rounds, chaosEnded.Sub(began).Round(time.Millisecond), counts, skipped)
	if n := counts["server restart"]; n > 0 && n == counts["server restart past the grace"] {
		// Said, since a busy machine may make every restart a long one.
		t.Logf("seed %d: no restart stayed within reconnect_grace: that a short one spends no attempt went untested in this run", seed)
	}

	// Then calm: everything must settle, at the machine's pace: a task
	// settles at least every 2 minutes (a retry waits out a fencing window
	// of 14 s at most).
	testenv.Drains(t, 2*time.Minute, fmt.Sprintf("every task DONE with its job completed (seed %d)", seed), func() (int, error) {
		open, err := unsettled()
		if err != nil {
			return -1, err
		}
		return len(strings.Fields(open)), fmt.Errorf("unsettled: %s", open)
	})
	t.Logf("calm: every task settled %s after the chaos ended", time.Since(chaosEnded).Round(time.Millisecond))

	// No process of any attempt remains: nothing carries a run id of this
	// test's tasks, and no beats file grows.
	testenv.Eventually(t, 5*time.Second, fmt.Sprintf("every process of every attempt to be gone (seed %d)", seed), func() (bool, error) {
		left := attemptProcesses(env.Tag())
		return len(left) == 0, fmt.Errorf("still running: %v", left)
	})
	sizes := beatSizes(env.Dir, ids)
	still := testenv.Holds(time.Second, func() bool { return maps.Equal(sizes, beatSizes(env.Dir, ids)) })
	if after := beatSizes(env.Dir, ids); !still {
		for _, id := range ids {
			if sizes[id] != after[id] {
				suspects[id] = true
				t.Errorf("seed %d: context %d: its beats file grew from %d to %d bytes after every task was DONE: a process of an attempt still runs",
					seed, id, sizes[id], after[id])
			}
		}
	}

	// orphans counts the killed task processes whose command's worker beat
	// on after the kill: the retry had to wait for it.
	totalAttempts, totalStarts, orphans := 0, 0, 0
	var unexplained []string
	for _, id := range ids {
		got, err := etlcontext.Tasks(context.Background(), env.Pool, etlcontext.TaskQuery{ID: id})
		if err != nil || len(got) != 1 {
			t.Fatalf("seed %d: read context %d: %v (%d rows)", seed, id, err, len(got))
		}
		task := got[0]
		totalAttempts += task.Attempt
		starts := w.starts(id)
		totalStarts += len(starts)

		// (1) No overlap, by the commands' own clocks.
		beats := w.beats(id)
		if !checkNoOverlap(t, seed, id, starts, beats) {
			suspects[id] = true
		}
		for a, killedAt := range runnerKilled {
			if a.id == id && len(beats[a.attempt]) > 0 && slices.Max(beats[a.attempt]) > killedAt {
				orphans++
			}
		}

		// (2) The attempt that finished is the last that started; a
		// cancelled one may have been cancelled before its command started.
		switch {
		case task.Status == etlcontext.StatusDone && (len(starts) == 0 || starts[len(starts)-1][0] != strconv.Itoa(task.Attempt)):
			suspects[id] = true
			t.Errorf("seed %d: context %d: DONE by attempt %d, but the starts are %v", seed, id, task.Attempt, starts)
		case task.Status == etlcontext.StatusCancelled && len(starts) > 0:
			if last, _ := strconv.Atoi(starts[len(starts)-1][0]); last > task.Attempt {
				suspects[id] = true
				t.Errorf("seed %d: context %d: CANCELLED at attempt %d, but the starts are %v", seed, id, task.Attempt, starts)
			}
		}
		// (3) No attempt started twice; each resumed from a checkpoint of
		// an attempt that started before it.
		started := map[int]bool{}
		for _, s := range starts {
			a, _ := strconv.Atoi(s[0])
			if started[a] {
				suspects[id] = true
				t.Errorf("seed %d: context %d: attempt %d started twice: %v", seed, id, a, starts)
			}
			if cp := strings.Join(s[3:], " "); cp != "none" {
				var c struct{ Attempt int }
				if err := json.Unmarshal([]byte(cp), &c); err != nil || !started[c.Attempt] || c.Attempt >= a {
					suspects[id] = true
					t.Errorf("seed %d: context %d: attempt %d resumed from checkpoint %s, not one of an attempt that started before it (%v)",
						seed, id, a, cp, starts)
				}
			}
			started[a] = true
		}

		// Every failed attempt was hit by a fault that fails attempts: its
		// task process was killed, or it was running when the server went
		// away for longer than reconnect_grace (by the outage measured).
		// A restart within reconnect_grace, or a supervisor's crash,
		// spends no attempt.
		events, err := etlcontext.Events(context.Background(), env.Pool, id)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		for _, e := range events {
			key := chaosAttempt{id, e.Attempt}
			if e.Type != "chaos:ERROR" || runnerKilled[key] != 0 || outageHit[key] {
				continue
			}
			suspects[id] = true
			unexplained = append(unexplained, fmt.Sprintf("context %d attempt %d (running during a restart: %v): %s",
				id, e.Attempt, restartHit[key], e.Payload))
		}
	}
	for _, u := range unexplained {
		t.Errorf("seed %d: an attempt failed that no fault explains: %s", seed, u)
	}
	t.Logf("seed %d: %d tasks settled; rounds %d (%v); %d task processes killed (%d left a worker that beat on after the kill); %d attempts recorded, %d commands started; %s in all",
		seed, len(ids), rounds, counts, len(runnerKilled), orphans, totalAttempts, totalStarts, time.Since(began).Round(time.Millisecond))
}
