//! `conflux trace report`'s output: aligned tables for people (nccl-tests' column style, so
//! the numbers read like a benchmark's) or one JSON object for scripts.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use serde_json::{json, Value};

use super::steps::StepSummary;
use super::Analysis;

const NO_STEPS: &str = "no steps marked: call comm.mark_step() (Rust) or conflux.mark_step() (Python) at the \
                        start of each step to see where step time goes";

/// The report as text.
pub fn text(an: &Analysis) -> String {
    let mut o = String::new();
    header(an, &mut o);
    ops_table(an, &mut o);
    steps_table(an, &mut o);
    match &an.straggler {
        Some(s) => writeln!(
            o,
            "straggler: rank {} arrived last at {:.0}% of {} collectives, {} late (median), {} (p99)",
            s.rank,
            s.last_fraction * 100.0,
            s.collectives,
            ms(s.late_ms_median),
            ms(s.late_ms_p99)
        ),
        None => writeln!(o, "straggler: none (no collective that every rank of a communicator of 2+ recorded)"),
    }
    .ok();
    // Arrival order across hosts is only as good as the clock offsets between them.
    let unc = an.ranks.iter().map(|r| r.meta.clock.uncertainty_ns).max().unwrap_or(0) as f64 / 1e6;
    if let Some(s) = an.straggler.as_ref().filter(|s| unc > 0.0 && s.late_ms_median <= 2.0 * unc) {
        let _ = writeln!(
            o,
            "  (the clocks agree only to within {}: rank {}'s lateness is within twice that, so may be the clocks')",
            ms(unc),
            s.rank
        );
    }
    o
}

/// Milliseconds with a precision that suits them.
fn ms(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1} ms")
    } else if v >= 0.1 {
        format!("{v:.2} ms")
    } else {
        format!("{:.1} µs", v * 1e3)
    }
}

fn header(an: &Analysis, o: &mut String) {
    let world = an.ranks.iter().map(|r| r.meta.world_size).max().unwrap_or(0);
    let hosts: BTreeSet<&str> = an.ranks.iter().map(|r| r.meta.host.as_str()).collect();
    let ops: usize = an.ranks.iter().map(|r| r.ops.len()).sum();
    let failed: usize = an.ranks.iter().map(|r| r.ops.iter().filter(|o| o.failed).count()).sum();
    let methods: BTreeSet<&str> = an.ranks.iter().map(|r| r.meta.clock.method.as_str()).collect();
    let unc = an.ranks.iter().map(|r| r.meta.clock.uncertainty_ns).max().unwrap_or(0);
    let hosts_list: Vec<&str> = hosts.iter().copied().collect();
    let _ = writeln!(
        o,
        "# conflux trace: {} of {world} ranks on {} host{} ({}), {ops} ops recorded ({failed} failed)",
        an.ranks.len(),
        hosts.len(),
        if hosts.len() == 1 { "" } else { "s" },
        hosts_list.join(", ")
    );
    let methods: Vec<&str> = methods.into_iter().collect();
    let _ = writeln!(o, "# clock: {} (uncertainty up to {})", methods.join(", "), ms(unc as f64 / 1e6));
    let (skipped, dropped) = lost(an);
    if skipped + dropped > 0 {
        let _ = writeln!(o, "# lost: {skipped} bytes of records skipped, {dropped} records dropped by writers");
    }
}

fn lost(an: &Analysis) -> (u64, u64) {
    (an.ranks.iter().map(|r| r.skipped).sum(), an.ranks.iter().map(|r| r.meta.dropped).sum())
}

fn ops_table(an: &Analysis, o: &mut String) {
    let _ = writeln!(o, "#\n# operations (time: started -> ended on each rank; count over all ranks)");
    let _ = writeln!(
        o,
        "# {:>14} {:>12} {:>12} {:>8} {:>5} {:>8} {:>10} {:>10} {:>10} {:>10} {:>8} {:>8}",
        "op",
        "size(B)",
        "algo",
        "link",
        "ranks",
        "count",
        "total(ms)",
        "mean(us)",
        "p50(us)",
        "p99(us)",
        "algbw",
        "busbw"
    );
    for r in &an.ops {
        let _ = writeln!(
            o,
            "  {:>14} {:>12} {:>12} {:>8} {:>5} {:>8} {:>10.2} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>8.2}",
            r.op,
            r.bytes_class,
            r.algo,
            r.link,
            r.ranks,
            r.count,
            r.total_ms,
            r.mean_us,
            r.p50_us,
            r.p99_us,
            r.algbw_gbps,
            r.busbw_gbps
        );
    }
    if an.ops.is_empty() {
        let _ = writeln!(o, "  (no operations recorded)");
    }
}

fn steps_table(an: &Analysis, o: &mut String) {
    let _ = writeln!(o, "#\n# steps (medians over each rank's steps; exposed = waiting + transfer; ms)");
    if an.steps.all.count == 0 {
        let _ = writeln!(o, "  {NO_STEPS}");
        return;
    }
    let _ = writeln!(
        o,
        "# {:>5} {:>6} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>6} {:>6}",
        "rank", "steps", "step", "worst", "compute", "exposed", "waiting", "transfer", "overlapped", "comm%", "worst%"
    );
    let row = |o: &mut String, who: &str, s: &StepSummary| {
        let m = &s.median;
        let _ = writeln!(
            o,
            "  {:>5} {:>6} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>6.1} {:>6.1}",
            who,
            s.count,
            m.step_ms,
            s.step_ms_worst,
            m.compute_ms,
            m.exposed_ms,
            m.waiting_ms,
            m.transfer_ms,
            m.overlapped_ms,
            m.comm_share * 100.0,
            s.comm_share_worst * 100.0
        );
    };
    for (rank, s) in &an.steps.per_rank {
        row(o, &rank.to_string(), s);
    }
    row(o, "all", &an.steps.all);
}

fn summary_json(s: &StepSummary) -> Value {
    let m = &s.median;
    json!({
        "count": s.count,
        "step_ms": m.step_ms,
        "step_ms_worst": s.step_ms_worst,
        "compute_ms": m.compute_ms,
        "exposed_ms": m.exposed_ms,
        "waiting_ms": m.waiting_ms,
        "transfer_ms": m.transfer_ms,
        "overlapped_ms": m.overlapped_ms,
        "comm_share": m.comm_share,
        "comm_share_worst": s.comm_share_worst,
    })
}

/// The report as one JSON object.
pub fn json(an: &Analysis) -> Value {
    let ops: Vec<Value> = an
        .ops
        .iter()
        .map(|r| {
            json!({
                "op": r.op, "bytes_class": r.bytes_class, "algo": r.algo, "link": r.link, "ranks": r.ranks,
                "count": r.count, "total_ms": r.total_ms, "mean_us": r.mean_us, "p50_us": r.p50_us,
                "p99_us": r.p99_us, "algbw_gbps": r.algbw_gbps, "busbw_gbps": r.busbw_gbps,
            })
        })
        .collect();
    let mut steps = summary_json(&an.steps.all);
    let per_rank: Vec<Value> = an
        .steps
        .per_rank
        .iter()
        .map(|(rank, s)| {
            let mut v = summary_json(s);
            v["rank"] = json!(rank);
            v
        })
        .collect();
    steps["per_rank"] = Value::Array(per_rank);
    if an.steps.all.count == 0 {
        steps["hint"] = json!(NO_STEPS);
    }
    let straggler = an.straggler.as_ref().map(|s| {
        json!({
            "rank": s.rank, "last_fraction": s.last_fraction, "late_ms_median": s.late_ms_median,
            "late_ms_p99": s.late_ms_p99, "collectives": s.collectives,
        })
    });
    let clock: Vec<Value> = an
        .ranks
        .iter()
        .map(|r| {
            let c = &r.meta.clock;
            json!({"rank": r.meta.rank, "offset_ns": c.offset_ns, "uncertainty_ns": c.uncertainty_ns, "method": c.method})
        })
        .collect();
    let (skipped, dropped) = lost(an);
    json!({
        "ranks": an.ranks.len(),
        "world_size": an.ranks.iter().map(|r| r.meta.world_size).max().unwrap_or(0),
        "ops": ops,
        "steps": steps,
        "straggler": straggler,
        "clock": clock,
        "skipped_bytes": skipped,
        "dropped": dropped,
    })
}
