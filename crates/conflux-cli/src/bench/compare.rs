//! Several algorithms side by side: which ones `--algo` names, and what becomes of their rows —
//! the `--report-auto` table (auto against the best forced algorithm, size by size), `--csv`
//! and `--plot`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use conflux::algo::select;
use conflux::{Algo, OpKind};

use super::plot::{self, Panel, Point, Series};
use super::stats::{best_of, paired, TARGET};
use super::Row;

/// `--algo`: a comma list of algorithm names and `auto`, or `all` (every algorithm that
/// implements the operation, and auto). None in the list stands for auto. Without `--algo`,
/// just auto (which honours CONFLUX_ALGO).
pub fn parse(spec: Option<&str>) -> Result<Vec<Option<Algo>>, String> {
    let Some(spec) = spec else { return Ok(vec![None]) };
    let mut out = Vec::new();
    for name in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match name {
            "all" => out.extend(Algo::ALL.iter().map(|&a| Some(a)).chain([None])),
            "auto" => out.push(None),
            _ => out.push(Some(Algo::parse(name).ok_or_else(|| format!("unknown algorithm {name:?}"))?)),
        }
    }
    out.dedup();
    if out.is_empty() {
        return Err("--algo names no algorithm".into());
    }
    Ok(out)
}

/// The algorithms of `list` that implement `op` (auto always does).
pub fn for_op(list: &[Option<Algo>], op: &str) -> Vec<Option<Algo>> {
    let kind = OpKind::parse(op);
    list.iter().copied().filter(|a| a.is_none_or(|a| kind.is_some_and(|k| select::implements(a, k)))).collect()
}

/// Auto's busbw against the best forced algorithm's (the one of lowest median time) at each
/// size of each operation, with the algorithm auto chose. Two ratios, each the median over
/// rounds of the per-round time ratio (the algorithms take turns within a round, so a ratio of
/// neighbouring batches cancels the drift that moves both): `run`, auto's own batches against
/// the best's; and `choice`, the better of that and the forced batches of the algorithm auto
/// chose against the best's, which separates a wrong choice from noise between two runs of
/// one algorithm. `run 95%` is the run ratio's confidence interval: where it holds 0.90 or
/// more, the miss may be noise (two runs of one algorithm at 4-8 ranks on 2 cores are 20-35%
/// apart batch to batch); `<<` marks a run whose whole interval is below. `rounds` is how many
/// rounds the size took: more than `--rounds` where the first ones left the run ratio
/// undecided (see `timing.rs`).
pub fn report_auto(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# auto against the best forced algorithm (busbw ratio; >= {TARGET:.2} is the target)");
    let _ = writeln!(
        out,
        "#{:>14} {:>12} {:>14} {:>10} {:>20} {:>10} {:>7} {:>7} {:>6} {:>11}",
        "op", "size", "best", "busbw", "auto", "busbw", "run", "choice", "rounds", "run 95%"
    );
    let mut by: BTreeMap<(&str, usize), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by.entry((r.op, r.bytes)).or_default().push(r);
    }
    let (mut compared, mut worst, mut below, mut surely_below) = (0, f64::INFINITY, 0, 0);
    let (mut worst_choice, mut wrong_choice, mut surely_wrong) = (f64::INFINITY, 0, 0);
    for ((op, bytes), group) in &by {
        let auto = group.iter().find(|r| r.forced.is_none());
        let forced: Vec<&Row> = group.iter().copied().filter(|r| r.forced.is_some()).collect();
        let samples: Vec<&[f64]> = forced.iter().map(|r| r.samples.as_slice()).collect();
        let (Some(auto), Some(best)) = (auto, best_of(&samples).map(|k| forced[k])) else { continue };
        compared += 1;
        // Time ratios, equal to busbw ratios at one size, and defined at 0 bytes too.
        let run = paired(&best.samples, &auto.samples);
        let same = group.iter().find(|r| r.forced.is_some() && r.forced == auto.chosen);
        let choice = same.map(|s| paired(&best.samples, &s.samples)).filter(|c| c.median > run.median).unwrap_or(run);
        worst = worst.min(run.median);
        worst_choice = worst_choice.min(choice.median);
        below += (run.median < TARGET) as usize;
        surely_below += (run.hi < TARGET) as usize;
        wrong_choice += (choice.median < TARGET) as usize;
        surely_wrong += (choice.hi < TARGET) as usize;
        let mark = if run.hi < TARGET {
            " <<"
        } else if run.median < TARGET {
            " <"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            " {op:>14} {bytes:>12} {:>14} {:>10.3} {:>20} {:>10.3} {:>7.2} {:>7.2} {:>6} {:>5.2}-{:<5.2}{mark}",
            best.label(),
            best.busbw,
            auto.label(),
            auto.busbw,
            run.median,
            choice.median,
            auto.samples.len(),
            run.lo,
            run.hi,
        );
    }
    let _ = writeln!(
        out,
        "# lowest run ratio {worst:.2}, {below} of {compared} sizes below {TARGET:.2} ({surely_below} with the whole 95% interval below); \
         lowest choice ratio {worst_choice:.2}, {wrong_choice} below {TARGET:.2} ({surely_wrong} with the whole interval below)"
    );
    out
}

/// One line per row; `round_us` lists the microseconds per call of each round, space-separated.
pub fn csv(rows: &[Row]) -> String {
    let mut out =
        String::from("op,algo,chosen,bytes,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong,round_us\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.3},{:.4},{:.4},{},{}",
            r.op,
            r.forced.map_or("auto", |a| a.name()),
            r.chosen.map_or("", |a| a.name()),
            r.bytes,
            r.count,
            r.dtype.name(),
            r.redop.map_or("none", |o| o.name()),
            r.root.map_or(-1, |x| x as i64),
            r.us,
            r.algbw,
            r.busbw,
            r.wrong,
            r.samples.iter().map(|us| format!("{us:.2}")).collect::<Vec<_>>().join(" ")
        );
    }
    out
}

pub fn svg(rows: &[Row], title: &str, subtitle: &str) -> String {
    let mut panels: Vec<Panel> = Vec::new();
    for r in rows {
        let at = match panels.iter().position(|p| p.title == r.op) {
            Some(i) => i,
            None => {
                panels.push(Panel { title: r.op.to_string(), series: Vec::new() });
                panels.len() - 1
            }
        };
        let label = r.forced.map_or("auto", |a| a.name()).to_string();
        let series = &mut panels[at].series;
        let s = match series.iter().position(|s| s.label == label) {
            Some(i) => i,
            None => {
                series.push(Series { label, points: Vec::new() });
                series.len() - 1
            }
        };
        series[s].points.push(Point { bytes: r.bytes as f64, time_us: r.us, busbw_gbps: r.busbw });
    }
    plot::svg(title, subtitle, &panels)
}
