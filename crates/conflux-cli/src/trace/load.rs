//! Reading a trace directory for the report and the merge: the library's tolerant reader
//! (a damaged or missing rank is left out with a warning, not fatal), then every record's
//! times put in order, so that no odd record can distort the arithmetic after it.

use std::path::Path;

use conflux::trace::RankTrace;

/// Every usable rank in `dir`, by global rank, and a warning for each file left out or
/// record fixed. An error when the directory cannot be listed or holds no usable rank.
pub fn load(dir: &Path) -> Result<(Vec<RankTrace>, Vec<String>), String> {
    let loaded = conflux::trace::read_dir(dir).map_err(|e| e.to_string())?;
    let (mut ranks, mut warnings) = (loaded.ranks, loaded.problems);
    for r in &mut ranks {
        let odd = sanitize(r);
        if odd > 0 {
            warnings.push(format!("rank {}: {odd} records with times out of order, clamped", r.meta.rank));
        }
        if r.skipped > 0 {
            warnings.push(format!("rank {}: {} bytes of records skipped (file cut short?)", r.meta.rank, r.skipped));
        }
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
