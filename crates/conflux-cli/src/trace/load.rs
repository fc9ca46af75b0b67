//! Reading a trace directory, tolerating damage: `conflux::trace::read_dir` gives up on the
//! whole directory when one meta file is unreadable, but after a crash the point is to see
//! what the surviving ranks recorded. So each rank's files are read on their own (with the
//! library's decoder), and a rank whose meta file cannot be used is left out with a warning.

use std::path::Path;

use conflux::trace::meta::{Meta, FORMAT, VERSION};
use conflux::trace::read::decode;
use conflux::trace::RankTrace;

/// Every usable rank in `dir`, by global rank, and a warning for each file left out. An
/// error when the directory cannot be listed or holds no usable rank.
pub fn load(dir: &Path) -> Result<(Vec<RankTrace>, Vec<String>), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut metas: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("rank-") && name.ends_with(".json")
        })
        .collect();
    metas.sort();
    let mut warnings = Vec::new();
    let mut ranks: Vec<RankTrace> = Vec::new();
    for path in metas {
        let meta = std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Meta>(&t).map_err(|e| e.to_string()))
            .and_then(|m| match (m.format == FORMAT, m.version == VERSION) {
                (true, true) => Ok(m),
                _ => Err(format!("format {:?} version {}, expected {FORMAT:?} version {VERSION}", m.format, m.version)),
            });
        let meta = match meta {
            Ok(m) => m,
            Err(e) => {
                warnings.push(format!("{}: left out: {e}", path.display()));
                continue;
            }
        };
        if ranks.iter().any(|r| r.meta.rank == meta.rank) {
            warnings.push(format!("{}: left out: a second file of rank {}", path.display(), meta.rank));
            continue;
        }
        let bin = path.with_extension("bin");
        let bytes = match std::fs::read(&bin) {
            Ok(b) => b,
            Err(e) => {
                warnings.push(format!("{}: {e}; rank {} has no records", bin.display(), meta.rank));
                Vec::new()
            }
        };
        let mut r = decode(meta, &bytes);
        let odd = sanitize(&mut r);
        if odd > 0 {
            warnings.push(format!("rank {}: {odd} records with times out of order, clamped", r.meta.rank));
        }
        if r.skipped > 0 {
            warnings.push(format!("rank {}: {} bytes of records skipped (file cut short?)", r.meta.rank, r.skipped));
        }
        ranks.push(r);
    }
    if ranks.is_empty() {
        return Err(format!(
            "no conflux trace in {} (expected rank-<r>.json and rank-<r>.bin, written with CONFLUX_TRACE={})",
            dir.display(),
            dir.display()
        ));
    }
    ranks.sort_by_key(|r| r.meta.rank);
    let world = ranks.iter().map(|r| r.meta.world_size).max().unwrap_or(0);
    let missing: Vec<String> =
        (0..world).filter(|w| !ranks.iter().any(|r| r.meta.rank == *w)).map(|w| w.to_string()).collect();
    if !missing.is_empty() {
        warnings.push(format!("no trace of rank {} (of {world}): its collectives are incomplete", missing.join(", ")));
    }
    Ok((ranks, warnings))
}

/// Puts each record's times in range and in order — issued ≤ started ≤ ended, began ≤ ended — and returns
/// how many needed it. A time the writer left at zero (an operation that failed before it
/// started, or never ended) decodes to exactly the clock offset; left as is it would drag the
/// trace's origin back to the clock's epoch and stretch every span. Such a time takes its
/// neighbour's: a start that never happened is the end, an end that never came the start.
pub fn sanitize(r: &mut RankTrace) -> usize {
    let unset = r.meta.clock.offset_ns;
    let mut odd = 0;
    // Garbage (a torn or foreign record) could hold any 64-bit time; a day-old clock reads
    // about 2^46 ns, so bounding times to [0, 2^60] keeps every difference and sum in range.
    let sane = |t: &mut i64| *t = (*t).clamp(0, 1 << 60);
    for o in &mut r.ops {
        let before = (o.issued, o.started, o.ended);
        if o.ended == unset {
            o.ended = o.started.max(o.issued);
        }
        if o.started == unset {
            o.started = o.ended;
        }
        if o.issued == unset {
            o.issued = o.started;
        }
        [&mut o.issued, &mut o.started, &mut o.ended].into_iter().for_each(sane);
        o.started = o.started.clamp(o.issued.min(o.ended), o.ended.max(o.issued));
        o.ended = o.ended.max(o.started);
        o.issued = o.issued.min(o.started);
        if (o.issued, o.started, o.ended) != before {
            odd += 1;
        }
    }
    for m in &mut r.steps {
        sane(&mut m.at);
    }
    for w in &mut r.waits {
        sane(&mut w.began);
        sane(&mut w.ended);
        if w.ended < w.began {
            w.ended = w.began;
            odd += 1;
        }
    }
    odd
}

#[cfg(test)]
mod tests {
    use super::super::fixture::{all_reduce, rank};
    use super::*;

    #[test]
    fn unset_and_reversed_times_are_put_in_order() {
        let mut r = rank(0, 1);
        r.meta.clock.offset_ns = 7;
        all_reduce(&mut r, 0, false, 100, 7, 150); // failed before it started
        all_reduce(&mut r, 1, false, 7, 200, 250); // issue time lost
        all_reduce(&mut r, 2, false, 300, 320, 7); // never ended
        all_reduce(&mut r, 3, false, 400, 390, 380); // reversed
        all_reduce(&mut r, 4, false, 500, 510, 520); // fine
        all_reduce(&mut r, 5, false, i64::MAX, i64::MIN, 1); // garbage
        assert_eq!(sanitize(&mut r), 5);
        let t: Vec<_> = r.ops.iter().map(|o| (o.issued, o.started, o.ended)).collect();
        assert_eq!(
            t,
            vec![(100, 150, 150), (200, 200, 250), (300, 320, 320), (390, 390, 390), (500, 510, 520), (1, 1, 1)]
        );
    }
}
