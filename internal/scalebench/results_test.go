package scalebench_test

import (
	"fmt"
	"io"
	"math"
	"slices"

	"github.com/dama-etl/dama/config"
)

// result holds the figures of one run (one lock mode, one size): m maps a
// metric's key (see rows) to its value; a missing one was not measured.
type result struct {
	mode config.LockMode
	n    int
	m    map[string]float64
}

func (r *result) name() string { return fmt.Sprintf("%s/%d", r.mode, r.n) }

func (r *result) get(key string) float64 {
	if v, ok := r.m[key]; ok {
		return v
	}
	return math.NaN()
}

// say prints one line of the run's details as it is measured.
func (r *result) say(format string, args ...any) {
	fmt.Printf("[%s] %s\n", r.name(), fmt.Sprintf(format, args...))
}

// A row of the summary: a metric of each run.
type row struct {
	label string
	key   string
	fmt   string
}

var rows = []row{
	{"all N hold their lock after (s)", "start_all_s", "%.1f"},
	{"transactions/s", "tx_s", "%.1f"},
	{"river_job updates/s", "river_upd_s", "%.1f"},
	{"etl_contexts updates/s", "ctx_upd_s", "%.1f"},
	{"dead not removable: river_job", "dead_river", "%.0f"},
	{"dead not removable: etl_contexts", "dead_ctx", "%.0f"},
	{"dead not removable: churn table", "dead_churn", "%.0f"},
	{"server log ERROR lines (window)", "errors", "%.0f"},
	{"supervisor CPU (% of a core)", "sup_cpu", "%.1f"},
	{"supervisor RSS (MB)", "sup_rss", "%.1f"},
	{"task process RSS median (MB)", "runner_rss_med", "%.1f"},
	{"task process RSS max (MB)", "runner_rss_max", "%.1f"},
	{"task process PSS median (MB)", "runner_pss_med", "%.1f"},
	{"task processes CPU, all (% of a core)", "runners_cpu", "%.1f"},
	{"server CPU, all (% of a core)", "server_cpu", "%.1f"},
	{"server connections (less the bench's)", "conns", "%.0f"},
	{"  of the supervisor", "conns_sup", "%.0f"},
	{"  per task", "conns_task", "%.2f"},
	{"plain River insert→Work p50 (ms)", "river_p50", "%.1f"},
	{"plain River insert→Work p99 (ms)", "river_p99", "%.1f"},
	{"fork/exec+connect+lock p50 (ms)", "fork_p50", "%.1f"},
	{"fork/exec+connect+lock p99 (ms)", "fork_p99", "%.1f"},
	{"submit→lock p50, 0 running (ms)", "lock0_p50", "%.1f"},
	{"submit→lock p99, 0 running (ms)", "lock0_p99", "%.1f"},
	{"submit→lock p50, N running (ms)", "lockN_p50", "%.1f"},
	{"submit→lock p99, N running (ms)", "lockN_p99", "%.1f"},
	{"  p50 0 running / (River + fork)", "ratio_floor0", "%.2f"},
	{"  p50 N running / 0 running", "ratio_lock", "%.2f"},
	{"  p50 N running / (River + fork)", "ratio_floor", "%.2f"},
	{"SIGKILL: all adopted (s)", "adopt_s", "%.1f"},
	{"SIGKILL, adopt, exit: all settled (s)", "settle_s", "%.2f"},
	{"  a task's p50 (s)", "settle_p50_s", "%.2f"},
}

func printSummary(w io.Writer, p params, results []*result) {
	fmt.Fprintf(w, "\n== scale: one supervisor, N quiet tasks, window %s ==\n", p.window)
	fmt.Fprintf(w, "%-40s", "")
	for _, r := range results {
		fmt.Fprintf(w, " %14s", r.name())
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		fmt.Fprintf(w, "%-40s", row.label)
		for _, r := range results {
			v := r.get(row.key)
			if math.IsNaN(v) {
				fmt.Fprintf(w, " %14s", "-")
				continue
			}
			fmt.Fprintf(w, " %14s", fmt.Sprintf(row.fmt, v))
		}
		fmt.Fprintln(w)
	}
	for _, r := range results {
		if r.get("complete") != 1 {
			fmt.Fprintf(w, "(%s did not run to the end: see its log above)\n", r.name())
		}
	}
	fmt.Fprintln(w, "\ntargets (a benchmark: reported, never enforced):")
	for _, t := range targets(p, results) {
		fmt.Fprintln(w, "  "+t)
	}
}

// targets checks the figures the issue asks of the new design.
func targets(p params, results []*result) []string {
	var out []string
	verdict := func(ok bool, vals ...float64) string {
		for _, v := range vals {
			if math.IsNaN(v) {
				return "n/a"
			}
		}
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	// The size 0, if measured, is the idle cost: the targets compare the
	// smallest size with tasks to the largest.
	var sizes []int
	for _, n := range p.sizes {
		if n > 0 {
			sizes = append(sizes, n)
		}
	}
	if len(sizes) == 0 {
		return []string{"(no size with tasks)"}
	}
	small, large := slices.Min(sizes), slices.Max(sizes)
	find := func(mode config.LockMode, n int) *result {
		for _, r := range results {
			if r.mode == mode && r.n == n {
				return r
			}
		}
		return nil
	}
	for _, mode := range p.modes {
		lo, hi := find(mode, small), find(mode, large)
		if small != large {
			a, z := lo.get("tx_s"), hi.get("tx_s")
			out = append(out, fmt.Sprintf("%-8s transactions/s at %d (%.1f) <= 1.5 x at %d (%.1f): %s",
				mode, large, z, small, a, verdict(z <= 1.5*a, a, z)))
		}
		for _, n := range sizes {
			r := find(mode, n)
			tx := r.get("tx_s")
			out = append(out, fmt.Sprintf("%-8s transactions/s at %d (%.1f) <= 20: %s", mode, n, tx, verdict(tx <= 20, tx)))
			e := r.get("errors")
			out = append(out, fmt.Sprintf("%-8s server log ERROR lines at %d (%.0f) = 0: %s", mode, n, e, verdict(e == 0, e)))
			if mode == config.LockModeHost {
				c, limit := r.get("conns"), 40.0
				if n > 300 {
					limit = 60
				}
				out = append(out, fmt.Sprintf("%-8s server connections at %d (%.0f; supervisor %.0f, per task %.3f) <= %.0f: %s",
					mode, n, c, r.get("conns_sup"), r.get("conns_task"), limit, verdict(c <= limit, c)))
				// PSS, not RSS: RSS counts in full the program's pages
				// that every task process of the host shares.
				m := r.get("runner_pss_med")
				out = append(out, fmt.Sprintf("%-8s task process PSS median at %d (%.1f MB; RSS %.1f MB) <= 10 MB: %s",
					mode, n, m, r.get("runner_rss_med"), verdict(m <= 10, m)))
			}
			if mode == config.LockModeAdvisory {
				dr, dc := r.get("dead_river"), r.get("dead_churn")
				out = append(out, fmt.Sprintf("%-8s dead not removable at %d (river_job %.0f, churn %.0f) = 0: %s",
					mode, n, dr, dc, verdict(dr == 0 && dc == 0, dr, dc)))
				c := r.get("conns_task")
				out = append(out, fmt.Sprintf("%-8s connections per task at %d (%.2f; total %.0f, supervisor %.0f) = 1: %s",
					mode, n, c, r.get("conns"), r.get("conns_sup"), verdict(c == 1, c)))
			}
		}
		// Absolute: a task that runs for hours does not need the start
		// of a bare fork/exec (docs/performance.md, the spare deleted).
		for _, n := range sizes {
			r := find(mode, n)
			for _, at := range []struct {
				key     string
				running int
			}{{"lock0", 0}, {"lockN", n}} {
				p50, p99 := r.get(at.key+"_p50"), r.get(at.key+"_p99")
				out = append(out, fmt.Sprintf("%-8s submit→lock at %d running: p50 %.1f ms <= 60, p99 %.1f ms <= 150: %s",
					mode, at.running, p50, p99, verdict(p50 <= 60 && p99 <= 150, p50, p99)))
			}
		}
	}
	return out
}
