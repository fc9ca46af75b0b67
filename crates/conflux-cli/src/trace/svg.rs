//! `conflux trace report --svg FILE`: a picture of where time went, written by hand (an SVG
//! is a few kinds of element; a plotting dependency would outweigh the command).
//!
//! (1) A timeline of a few consecutive steps — one band per rank coloured compute / waiting for
//! peers / transfer, communication hidden behind compute as a thin bar under it; (2) a bar per
//! rank of its median step split the same way, with its comm share. Without steps, the
//! timeline is the trace's last 20 ms and the bars measure that window.

use std::fmt::Write as _;

use super::steps::Step;
use super::Analysis;

const WIDTH: f64 = 960.0;
const LEFT: f64 = 90.0;
const PLOT: f64 = WIDTH - LEFT - 30.0;
const BAND: f64 = 18.0;
const ROW: f64 = 28.0;
const COMPUTE: &str = "#9ecae1";
const WAITING: &str = "#e6550d";
const TRANSFER: &str = "#fdae6b";
const OVERLAP: &str = "#31a354";
/// The window drawn when no step was marked.
const TAIL_NS: i64 = 20_000_000;

/// Text made safe for XML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The window to draw and its title: up to three consecutive closed steps (after the first,
/// a warm-up, when there are four or more), spanning every rank's steps of those numbers.
fn window(an: &Analysis) -> (i64, i64, String) {
    if let Some(reference) = an.sets.iter().find(|s| !s.steps.is_empty()) {
        let steps = &reference.steps;
        let skip = usize::from(steps.len() >= 4);
        let chosen = &steps[skip..(skip + 3).min(steps.len())];
        let nums: Vec<u64> = chosen.iter().map(|s| s.0).collect();
        let mut lo = chosen[0].1;
        let mut hi = chosen[chosen.len() - 1].2;
        for s in an.sets.iter().flat_map(|s| &s.steps).filter(|s| nums.contains(&s.0)) {
            lo = lo.min(s.1);
            hi = hi.max(s.2);
        }
        let (a, b) = (nums[0], nums[nums.len() - 1]);
        let title = if a == b { format!("step {a}") } else { format!("steps {a}-{b}") };
        return (lo, hi, title);
    }
    let end = an.ranks.iter().flat_map(|r| r.ops.iter().map(|o| o.ended)).max().unwrap_or(0);
    let start = an.ranks.iter().flat_map(|r| r.ops.iter().map(|o| o.issued)).min().unwrap_or(0);
    let lo = (end - TAIL_NS).max(start);
    (lo, end.max(lo + 1), "the last 20 ms (no steps marked: call mark_step)".into())
}

/// A round tick spacing giving about eight ticks over `span_ms`.
fn tick(span_ms: f64) -> f64 {
    let raw = (span_ms / 8.0).max(1e-6);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * p).find(|&t| t >= raw).unwrap_or(10.0 * p)
}

fn rect(o: &mut String, x: f64, y: f64, w: f64, h: f64, fill: &str) {
    let _ = writeln!(o, r#"<rect x="{x:.2}" y="{y:.1}" width="{:.2}" height="{h:.1}" fill="{fill}"/>"#, w.max(0.1));
}

fn text(o: &mut String, x: f64, y: f64, anchor: &str, s: &str) {
    let _ = writeln!(o, r#"<text x="{x:.1}" y="{y:.1}" text-anchor="{anchor}">{}</text>"#, esc(s));
}

/// The drawing.
pub fn draw(an: &Analysis) -> String {
    let (lo, hi, what) = window(an);
    let span = (hi - lo).max(1) as f64;
    let x = |t: i64| LEFT + (t.clamp(lo, hi) - lo) as f64 / span * PLOT;
    let n = an.ranks.len() as f64;
    let axis_y = 40.0 + n * ROW;
    let bars_top = axis_y + 80.0;
    let height = bars_top + 30.0 + n * ROW + 20.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" font-family="sans-serif" font-size="11">"#
    );
    rect(&mut o, 0.0, 0.0, WIDTH, height, "white");
    let _ = writeln!(o, r#"<g font-size="14">"#);
    text(&mut o, LEFT, 22.0, "start", &format!("conflux trace: {what}"));
    let _ = writeln!(o, "</g>");
    for (i, (r, s)) in an.ranks.iter().zip(&an.sets).enumerate() {
        let y = 36.0 + i as f64 * ROW;
        text(&mut o, LEFT - 8.0, y + BAND - 5.0, "end", &format!("rank {}", r.meta.rank));
        let _ = writeln!(o, r#"<g class="band" id="rank-{}">"#, r.meta.rank);
        rect(&mut o, x(lo), y, PLOT, BAND, COMPUTE);
        for &(a, b) in s.blocked.clip(lo, hi).minus(&s.waiting).spans() {
            rect(&mut o, x(a), y, x(b) - x(a), BAND, TRANSFER);
        }
        for &(a, b) in s.waiting.clip(lo, hi).spans() {
            rect(&mut o, x(a), y, x(b) - x(a), BAND, WAITING);
        }
        for &(a, b) in s.overlapped.clip(lo, hi).spans() {
            rect(&mut o, x(a), y + BAND + 1.0, x(b) - x(a), 3.0, OVERLAP);
        }
        for &(_, a, _) in s.steps.iter().filter(|st| st.1 > lo && st.1 < hi) {
            let _ = writeln!(
                o,
                r##"<line x1="{0:.2}" x2="{0:.2}" y1="{1:.1}" y2="{2:.1}" stroke="#333"/>"##,
                x(a),
                y - 2.0,
                y + BAND + 2.0
            );
        }
        let _ = writeln!(o, "</g>");
    }
    axis(&mut o, axis_y, span / 1e6);
    legend(&mut o, axis_y + 36.0);
    bars(an, &mut o, bars_top, lo, hi);
    o.push_str("</svg>\n");
    o
}

fn axis(o: &mut String, y: f64, span_ms: f64) {
    let _ = writeln!(o, r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#333"/>"##, LEFT + PLOT);
    let t = tick(span_ms);
    let mut v = 0.0;
    while v <= span_ms + 1e-9 {
        let px = LEFT + v / span_ms * PLOT;
        let _ = writeln!(o, r##"<line x1="{px:.1}" x2="{px:.1}" y1="{y:.1}" y2="{:.1}" stroke="#333"/>"##, y + 4.0);
        let digits = if t >= 1.0 { 0 } else { (-t.log10()).ceil() as usize };
        text(o, px, y + 16.0, "middle", &format!("{v:.digits$}"));
        v += t;
    }
    text(o, LEFT + PLOT, y + 30.0, "end", "ms");
}

fn legend(o: &mut String, y: f64) {
    let items = [
        (COMPUTE, "compute"),
        (WAITING, "waiting for peers"),
        (TRANSFER, "transfer"),
        (OVERLAP, "overlapped communication (thin bar)"),
    ];
    let mut x = LEFT;
    for (color, label) in items {
        rect(o, x, y - 9.0, 12.0, 10.0, color);
        text(o, x + 16.0, y, "start", label);
        x += 24.0 + label.len() as f64 * 6.5;
    }
}

/// A bar per rank: its median step (or the window) as compute, waiting and transfer.
fn bars(an: &Analysis, o: &mut String, top: f64, lo: i64, hi: i64) {
    let have_steps = an.steps.all.count > 0;
    let rows: Vec<(usize, Step)> = an
        .ranks
        .iter()
        .zip(&an.sets)
        .zip(&an.steps.per_rank)
        .map(|((r, s), (_, sum))| (r.meta.rank, if have_steps { sum.median } else { Step::of(s, lo, hi) }))
        .collect();
    let title = if have_steps { "median step per rank (ms)" } else { "the window per rank (ms)" };
    text(o, LEFT, top, "start", title);
    let longest = rows.iter().map(|(_, s)| s.compute_ms + s.exposed_ms).fold(0.0, f64::max).max(1e-9);
    let w = |ms: f64| ms / longest * (PLOT - 160.0);
    for (i, (rank, s)) in rows.iter().enumerate() {
        let y = top + 12.0 + i as f64 * ROW;
        text(o, LEFT - 8.0, y + BAND - 5.0, "end", &format!("rank {rank}"));
        let mut x = LEFT;
        for (ms, color) in [(s.compute_ms, COMPUTE), (s.waiting_ms, WAITING), (s.transfer_ms, TRANSFER)] {
            if ms > 0.0 {
                rect(o, x, y, w(ms), BAND, color);
                x += w(ms);
            }
        }
        let label = format!("{:.2} ms, comm {:.0}%", s.step_ms, s.comm_share * 100.0);
        text(o, x + 6.0, y + BAND - 5.0, "start", &label);
    }
}
