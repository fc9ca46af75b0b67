//! Several algorithms side by side: which ones `--algo` names, and what becomes of their rows —
//! the `--report-auto` table (auto against the best forced algorithm, size by size), `--csv`
//! and `--plot`.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use conflux::algo::select;
use conflux::{Algo, OpKind};

use super::plot::{self, Panel, Point, Series};
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

/// Auto's busbw against the best forced algorithm's at each size of each operation, with the
/// algorithm auto chose. Returns the table and the lowest ratio.
pub fn report_auto(rows: &[Row]) -> (String, f64) {
    let mut out = String::new();
    let mut worst = f64::INFINITY;
    let _ = writeln!(out, "# auto against the best forced algorithm (busbw ratio; >= 0.90 is the target)");
    let _ = writeln!(
        out,
        "#{:>14} {:>12} {:>14} {:>10} {:>14} {:>10} {:>7}",
        "op", "size", "best", "busbw", "auto", "busbw", "ratio"
    );
    let mut by: BTreeMap<(&str, usize), Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by.entry((r.op, r.bytes)).or_default().push(r);
    }
    let mut below = 0;
    for ((op, bytes), group) in &by {
        let auto = group.iter().find(|r| r.forced.is_none());
        let best = group.iter().filter(|r| r.forced.is_some()).max_by(|a, b| a.busbw.total_cmp(&b.busbw));
        let (Some(auto), Some(best)) = (auto, best) else { continue };
        let ratio = if best.busbw > 0.0 { auto.busbw / best.busbw } else { best.us / auto.us };
        worst = worst.min(ratio);
        below += (ratio < 0.9) as usize;
        let _ = writeln!(
            out,
            " {op:>14} {bytes:>12} {:>14} {:>10.3} {:>14} {:>10.3} {:>6.2}{}",
            best.label(),
            best.busbw,
            auto.label(),
            auto.busbw,
            ratio,
            if ratio < 0.9 { " <" } else { "" }
        );
    }
    let _ = writeln!(out, "# lowest ratio {worst:.2}; {below} of {} sizes below 0.90", by.len());
    (out, worst)
}

pub fn csv(rows: &[Row]) -> String {
    let mut out = String::from("op,algo,chosen,bytes,count,type,redop,root,time_us,algbw_gbps,busbw_gbps,wrong\n");
    for r in rows {
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{:.3},{:.4},{:.4},{}",
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
            r.wrong
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
