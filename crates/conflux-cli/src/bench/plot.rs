//! `conflux bench --plot FILE.svg`: a standalone SVG of bus bandwidth and time against message
//! size, one row of two charts per operation and one line per algorithm. Written by hand (no
//! plotting dependency) as a pure function of the measurements: log axes, one shared legend, and
//! unplottable values (zero, negative, NaN, infinite) skipped rather than drawn at -infinity.

use std::fmt::Write as _;

/// One line of a chart: one algorithm's measurements, in increasing size.
pub struct Series {
    pub label: String,
    pub points: Vec<Point>,
}

#[derive(Clone, Copy)]
pub struct Point {
    pub bytes: f64,
    pub time_us: f64,
    pub busbw_gbps: f64,
}

/// One operation's measurements (e.g. "all_reduce"), one series per algorithm.
pub struct Panel {
    pub title: String,
    pub series: Vec<Series>,
}

/// Tableau 10: distinguishable from each other and on white, unlike the SVG named colours.
const PALETTE: [&str; 10] =
    ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
const CHART_W: f64 = 520.0;
const CHART_H: f64 = 340.0;
/// Outer margin, gap between the two charts of a row and between rows.
const PAD: f64 = 20.0;
const WIDTH: f64 = 3.0 * PAD + 2.0 * CHART_W;

/// What a chart shows: its axis name and the value it takes from a point.
type Metric = (&'static str, fn(&Point) -> f64);
const METRICS: [Metric; 2] = [("bus bandwidth (GB/s)", |p| p.busbw_gbps), ("time (us)", |p| p.time_us)];

/// A document: for each panel a row of two charts, busbw and time against size, both log-log.
pub fn svg(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    // Colours go by label in order of first appearance, so an algorithm keeps its colour in
    // every chart even when some panel lacks it.
    let all: Vec<&str> = panels.iter().flat_map(|p| &p.series).map(|s| s.label.as_str()).collect();
    let labels: Vec<&str> = all.iter().enumerate().filter(|&(i, l)| !all[..i].contains(l)).map(|(_, l)| *l).collect();
    // One legend for the whole document, wrapped into rows so it stays inside the width.
    let mut legend = String::new();
    let (mut x, mut y) = (PAD, 72.0);
    for l in &labels {
        let w = 44.0 + 7.0 * l.chars().count() as f64;
        if x > PAD && x + w > WIDTH - PAD {
            (x, y) = (PAD, y + 20.0);
        }
        let (c, radius) = style(&labels, l);
        line(&mut legend, (x, y), (x + 20.0, y), &format!(r#"stroke="{c}" stroke-width="2""#));
        circle(&mut legend, (x + 10.0, y), radius, c);
        text(&mut legend, (x + 26.0, y + 4.0), r#"font-size="12""#, l);
        x += w;
    }
    let top = if labels.is_empty() { 64.0 } else { y + 20.0 };
    let h = top + panels.len() as f64 * (CHART_H + PAD);
    let t = esc(title);
    let mut out = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {h}" width="{WIDTH}" height="{h}" font-family="sans-serif"><title>{t}</title><rect x="0" y="0" width="{WIDTH}" height="{h}" fill="white"/>"#
    );
    text(&mut out, (PAD, 30.0), r#"font-size="18" font-weight="bold""#, title);
    text(&mut out, (PAD, 50.0), r##"font-size="12" fill="#555""##, subtitle);
    out.push_str(&legend);
    // The size axis is shared by every chart so rows line up and compare directly.
    let xr = x_range(panels);
    for (i, j) in (0..panels.len()).flat_map(|i| [(i, 0), (i, 1)]) {
        let corner = (PAD + j as f64 * (CHART_W + PAD), top + i as f64 * (CHART_H + PAD));
        chart(&mut out, corner, &panels[i], METRICS[j], xr, &labels);
    }
    out.push_str("</svg>\n");
    out
}

/// `<text>`; the body is escaped here so that no caller can forget to.
fn text(out: &mut String, (x, y): (f64, f64), attrs: &str, body: &str) {
    let _ = write!(out, r#"<text x="{x:.1}" y="{y:.1}" {attrs}>{}</text>"#, esc(body));
}

fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), attrs: &str) {
    let _ = write!(out, r#"<line x1="{x1:.1}" y1="{y1:.1}" x2="{x2:.1}" y2="{y2:.1}" {attrs}/>"#);
}

fn circle(out: &mut String, (x, y): (f64, f64), r: f64, fill: &str) {
    let _ = write!(out, r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r:.1}" fill="{fill}"/>"#);
}

/// A label's colour and marker radius. Later labels get smaller markers: where two algorithms
/// coincide (auto picking ring, say) the later dot sits inside the earlier and both show.
fn style(labels: &[&str], label: &str) -> (&'static str, f64) {
    let i = labels.iter().position(|l| *l == label).unwrap_or(0);
    (PALETTE[i % PALETTE.len()], 4.5 - 2.0 * i as f64 / (labels.len().max(2) - 1) as f64)
}

/// The smallest and largest of some values, if there are any.
fn bounds(v: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    v.fold(None, |b, v| Some(b.map_or((v, v), |(lo, hi): (f64, f64)| (lo.min(v), hi.max(v)))))
}

/// Plottable on a log axis: finite and positive (busbw of a 1-rank run is 0; failed runs NaN).
fn ok(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

fn esc(s: &str) -> String {
    // Control characters are not allowed in XML 1.0 at all, not even escaped.
    let allowed = |c: &char| *c >= ' ' || matches!(c, '\t' | '\n' | '\r');
    let s: String = s.chars().filter(allowed).collect();
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Power-of-two exponents of the sizes, widened to at least one step so a lone size has room.
fn x_range(panels: &[Panel]) -> (i32, i32) {
    let plottable = |p: &&Point| ok(p.bytes) && (ok(p.time_us) || ok(p.busbw_gbps));
    let sizes = panels.iter().flat_map(|p| &p.series).flat_map(|s| &s.points).filter(plottable).map(|p| p.bytes);
    // With no data at all, the default 8B..64M sweep, so empty charts still have axes.
    let Some((mn, mx)) = bounds(sizes) else { return (3, 26) };
    let (lo, hi) = (mn.log2().floor() as i32, mx.log2().ceil() as i32);
    (lo - i32::from(lo == hi), hi + i32::from(lo == hi))
}

fn bytes_label(e: i32) -> String {
    match e {
        0..=69 => format!("{}{}", 1u64 << (e % 10), ["B", "K", "M", "G", "T", "P", "E"][e as usize / 10]),
        _ => format!("2^{e}"),
    }
}

/// Exponents to label: both ends (the sweep's first and last sizes are the ones people look
/// for), and between them every multiple of the smallest step that keeps labels a label-width
/// apart; multiples rather than offsets from the low end, so 1K and 1M are labelled when they can be.
fn x_labels(lo: i32, hi: i32, px_per_exp: f64) -> Vec<i32> {
    let width = (lo..=hi).map(|e| bytes_label(e).len()).max().unwrap_or(1) as f64 * 7.0 + 8.0;
    let step = ((width / px_per_exp).ceil() as i32).max(1);
    let mut v = vec![lo];
    v.extend((lo + 1..hi).filter(|e| e.rem_euclid(step) == 0 && ((e - lo).min(hi - e) as f64) * px_per_exp >= width));
    v.push(hi);
    v
}

/// log10 of a tick m x 10^d, computed in log space so huge or tiny decades cannot overflow.
fn ylog((m, d): (u32, i32)) -> f64 {
    d as f64 + f64::from(m).log10()
}

/// Log-scale ticks (m, d) = m x 10^d covering [10^lmn, 10^lmx]: 1-2-5 steps when the data spans
/// two decades or less, whole decades beyond, every k-th decade past eight so labels stay apart.
/// The axis runs from the tick at or below the minimum to the tick at or above the maximum.
fn y_ticks(lmn: f64, lmx: f64) -> Vec<(u32, i32)> {
    let (dlo, dhi) = (lmn.floor() as i32, lmx.ceil() as i32);
    let mants: &[u32] = if dhi - dlo <= 2 { &[1, 2, 5] } else { &[1] };
    let every = (dhi - dlo) / 8 + 1;
    let decades = (dlo - every..=dhi + every).filter(|d| d.rem_euclid(every) == 0);
    let cands: Vec<(u32, i32)> = decades.flat_map(|d| mants.iter().map(move |&m| (m, d))).collect();
    let mut i = cands.iter().rposition(|&t| ylog(t) <= lmn + 1e-9).unwrap_or(0);
    let mut j = cands.iter().position(|&t| ylog(t) >= lmx - 1e-9).unwrap_or(cands.len() - 1);
    if i >= j {
        // All values equal to a tick: show one tick either side rather than a zero-height axis.
        (i, j) = (i.saturating_sub(1), (i + 1).min(cands.len() - 1));
    }
    cands[i..=j].to_vec()
}

fn tick_label((m, d): (u32, i32)) -> String {
    match d {
        0..=8 => format!("{}{}", m * 10u32.pow(d as u32 % 3), ["", "k", "M"][d as usize / 3]),
        -4..=-1 => format!("{:.*}", (-d) as usize, f64::from(m) * 10f64.powi(d)),
        _ => format!("{m}e{d}"),
    }
}

/// One chart with its top-left corner at (ox, oy): grid, axes, then a line per series.
fn chart(out: &mut String, (ox, oy): (f64, f64), panel: &Panel, (name, f): Metric, xr: (i32, i32), labels: &[&str]) {
    // The plot area: room on the left for y labels, below for x labels and the axis name.
    let (l, r, t, b) = (ox + 58.0, ox + CHART_W - 14.0, oy + 26.0, oy + CHART_H - 40.0);
    // Each series' plottable points in log space: (log2 bytes, log10 value).
    let log = |s: &Series| -> Vec<_> {
        s.points.iter().filter(|p| ok(p.bytes) && ok(f(p))).map(|p| (p.bytes.log2(), f(p).log10())).collect()
    };
    let lines: Vec<(&str, Vec<(f64, f64)>)> = panel.series.iter().map(|s| (s.label.as_str(), log(s))).collect();
    let range = bounds(lines.iter().flat_map(|(_, v)| v).map(|&(_, y)| y));
    let yt = range.map_or_else(|| y_ticks(0.0, 1.0), |(mn, mx)| y_ticks(mn, mx)); // no data: 1..10
    let (ylo, yhi) = (ylog(yt[0]), ylog(yt[yt.len() - 1]));
    let (xlo, xhi) = (f64::from(xr.0), f64::from(xr.1));
    // A 6 px inset keeps markers at either end of a range off the frame.
    let px = |e: f64| l + 6.0 + (e - xlo) / (xhi - xlo) * (r - l - 12.0);
    let py = |v: f64| b - 6.0 - (v - ylo) / (yhi - ylo) * (b - t - 12.0);
    let (grid, small) = (r##"stroke="#e4e4e4""##, r##"font-size="11" fill="#444""##);
    let (ty, op) = (oy + 16.0, esc(&panel.title));
    let bold = r#"<tspan font-weight="bold">"#;
    let _ = write!(out, r#"<text x="{l:.1}" y="{ty:.1}" font-size="13">{bold}{op}</tspan> {name}</text>"#);
    for e in x_labels(xr.0, xr.1, (r - l - 12.0) / (xhi - xlo)) {
        let x = px(f64::from(e));
        line(out, (x, t), (x, b), grid);
        text(out, (x, b + 15.0), &format!(r#"text-anchor="middle" {small}"#), &bytes_label(e));
    }
    for &tick in &yt {
        let y = py(ylog(tick));
        line(out, (l, y), (r, y), grid);
        text(out, (l - 6.0, y + 4.0), &format!(r#"text-anchor="end" {small}"#), &tick_label(tick));
    }
    let (w, h) = (r - l, b - t);
    let _ = write!(out, r##"<rect x="{l:.1}" y="{t:.1}" width="{w:.1}" height="{h:.1}" fill="none" stroke="#999"/>"##);
    // Unlabelled powers of two still get a tick mark, unless there are too many to see.
    for e in (xr.0..=xr.1).filter(|_| xr.1 - xr.0 <= 64) {
        line(out, (px(f64::from(e)), b - 4.0), (px(f64::from(e)), b), r##"stroke="#999""##);
    }
    let grey = r##"text-anchor="middle" font-size="12" fill="#777""##;
    text(out, ((l + r) / 2.0, oy + CHART_H - 8.0), grey, "message size");
    if range.is_none() {
        text(out, ((l + r) / 2.0, (t + b) / 2.0), grey, "no data");
    }
    for (label, pts) in &lines {
        let (c, radius) = style(labels, label);
        if pts.len() >= 2 {
            let coords: Vec<String> = pts.iter().map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y))).collect();
            let style = r#"fill="none" stroke-width="2" stroke-linejoin="round""#;
            let _ = write!(out, r#"<polyline points="{}" stroke="{c}" {style}/>"#, coords.join(" "));
        }
        for &(x, y) in pts {
            circle(out, (px(x), py(y)), radius, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ring, tree and auto over 8B..64M for two operations: time = latency + size / bandwidth,
    /// and auto takes the faster of ring and tree.
    fn demo() -> Vec<Panel> {
        let time = |b: f64| [25.0 + b / 11e3, 9.0 + b / 6.5e3, (25.0 + b / 11e3).min(9.0 + b / 6.5e3)];
        let point =
            |bytes, time_us: f64, factor| Point { bytes, time_us, busbw_gbps: factor * bytes / (time_us * 1e3) };
        let sizes = || (3..=26).map(|e| f64::from(1u32 << e));
        let series = |i: usize, s: f64, f: f64| Series {
            label: ["ring", "tree", "auto"][i].into(),
            points: sizes().map(|b| point(b, s * time(b)[i], f)).collect(),
        };
        let panel =
            |title: &str, s, f| Panel { title: title.into(), series: (0..3).map(|i| series(i, s, f)).collect() };
        vec![panel("all_reduce", 1.0, 1.5), panel("all_gather", 0.6, 0.75)]
    }

    /// Asserts the document is well-formed enough for a browser: balanced tags, only known
    /// entities, every coordinate finite and inside the viewBox. Returns the polyline count.
    fn check(doc: &str) -> usize {
        let vb = doc.strip_prefix(r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox=""#).expect("root element");
        let vb: Vec<f64> = vb.split('"').next().unwrap().split(' ').map(|v| v.parse().unwrap()).collect();
        let known = ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"];
        assert!(!known.iter().fold(doc.to_string(), |d, k| d.replace(k, "")).contains('&'), "unknown entity");
        let mut stack = Vec::new();
        for tag in doc.split('<').skip(1).map(|t| t.split_once('>').expect("unclosed tag").0) {
            assert!(tag.matches('"').count() % 2 == 0, "bad tag {tag}");
            match tag.strip_prefix('/') {
                Some(name) => assert_eq!(stack.pop(), Some(name), "mismatched close"),
                None if !tag.ends_with('/') => stack.push(tag.split_whitespace().next().unwrap()),
                None => {}
            }
        }
        assert!(stack.is_empty() && doc.ends_with("</svg>\n"), "unclosed {stack:?}");
        for attr in ["points", "cx", "x", "x1", "x2", "cy", "y", "y1", "y2"] {
            let key = format!(" {attr}=\"");
            let values = doc.split(&key).skip(1).flat_map(|s| s.split('"').next().unwrap().split([' ', ',']));
            for (k, v) in values.map(|v| v.parse::<f64>().expect(attr)).enumerate() {
                // points= alternates x and y (each has an even count); the others are named after their axis.
                let max = vb[2 + if attr == "points" { k % 2 } else { usize::from(attr.contains('y')) }];
                assert!(v.is_finite() && (0.0..=max).contains(&v), "{attr}={v} outside {vb:?}");
            }
        }
        doc.matches("<polyline ").count()
    }

    #[test]
    fn demo_document() {
        let doc = svg("conflux bench: 4 ranks", "tcp transport, float32, sum", &demo());
        assert_eq!(check(&doc), 2 * 2 * 3, "one polyline per series per chart");
        let has = |l: &str| doc.contains(&format!(">{l}</text>"));
        assert!(has("8B") && (has("1K") || has("4K")) && (has("1M") || has("2M")) && has("64M"));
        // Same algorithm, same colour, everywhere: the ring's colour appears in all 4 charts.
        assert_eq!(doc.matches(&format!(r#"stroke="{}" fill="none""#, PALETTE[0])).count(), 4);
        if let Ok(path) = std::env::var("CONFLUX_PLOT_DEMO") {
            std::fs::write(path, &doc).unwrap();
        }
    }

    #[test]
    fn labels_are_escaped() {
        let series = vec![Series { label: "a<b&c".into(), points: vec![] }];
        let doc = svg("t\"'>", "s&", &[Panel { title: "<op>".into(), series }]);
        check(&doc);
        assert!(doc.contains(">a&lt;b&amp;c<") && doc.contains(">&lt;op&gt;<") && doc.contains(">t&quot;&#39;&gt;<"));
    }

    #[test]
    fn ticks() {
        let labels: Vec<String> = x_labels(3, 26, 448.0 / 23.0).into_iter().map(bytes_label).collect();
        assert_eq!(labels.join(" "), "8B 64B 256B 1K 4K 16K 64K 256K 1M 4M 16M 64M");
        let y = |lo: f64, hi: f64| {
            y_ticks(lo.log10(), hi.log10()).into_iter().map(tick_label).collect::<Vec<_>>().join(" ")
        };
        assert_eq!(y(0.02, 9.0), "0.01 0.1 1 10");
        assert_eq!(y(1.5, 40.0), "1 2 5 10 20 50");
        assert_eq!(y(3.0, 45000.0), "1 10 100 1k 10k 100k");
        assert_eq!(y(10.0, 10.0), "5 10 20");
        assert!(y_ticks(-300.0, 300.0).len() <= 10);
    }

    #[test]
    fn degenerate_inputs() {
        let p = |bytes, time_us, busbw_gbps| Point { bytes, time_us, busbw_gbps };
        let s = |label: &str, points| Series { label: label.into(), points };
        let one = |series| vec![Panel { title: "op".into(), series }];
        let nan = f64::NAN;
        let mixed = one(vec![
            s("zeros", vec![p(0.0, 3.0, 0.0), p(8.0, 0.0, -1.0), p(16.0, f64::INFINITY, 2.0)]),
            s("gap", vec![p(8.0, 2.0, 1.0), p(16.0, nan, nan), p(32.0, 4.0, 1.0)]),
            s("huge", vec![p(1e300, 1e-300, 1e300), p(f64::MIN_POSITIVE, 1e300, 1e-300)]),
        ]);
        let nothing = one(vec![s("none", vec![]), s("nan", vec![p(nan, nan, nan); 3])]);
        let single = one(vec![s("a", vec![p(1024.0, 5.0, 0.0)])]);
        // (document, polylines, markers, empty charts). Series with nothing to draw are only in
        // the legend (a marker each there); one point is one marker; "gap" bridges its NaN point
        // and "huge" spans everything (a line in each chart); "zeros" has one point, in busbw.
        let cases =
            [(vec![], 0, 0, 0), (one(vec![]), 0, 0, 2), (nothing, 0, 2, 2), (single, 0, 2, 1), (mixed, 4, 12, 0)];
        for (panels, lines, markers, empty) in cases {
            let doc = svg("", "", &panels);
            let n = |pattern| doc.matches(pattern).count();
            assert_eq!((check(&doc), n("<circle"), n(">no data<")), (lines, markers, empty));
        }
    }
}
