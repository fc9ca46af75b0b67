//! Byte moves too small for memcpy: a collective of a few words copies its payload two or three
//! times a call (into a ring or a slot, out of it), and memcpy's call and size dispatch cost
//! more than such a move itself.

/// Copies `src` into `dst`, which must be as long. Up to 64 bytes as two overlapping moves of
/// a fixed size, which the compiler turns into a handful of loads and stores; longer, memcpy.
#[inline]
pub(crate) fn copy(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    assert_eq!(dst.len(), n, "copy between slices of different lengths");
    match n {
        0..=3 => {
            for (d, s) in dst.iter_mut().zip(src) {
                *d = *s;
            }
        }
        4..=7 => overlapping::<4>(dst, src),
        8..=15 => overlapping::<8>(dst, src),
        16..=31 => overlapping::<16>(dst, src),
        32..=64 => overlapping::<32>(dst, src),
        _ => dst.copy_from_slice(src),
    }
}

/// The first and the last `W` bytes, which together cover all of them for `W <= len <= 2W`.
#[inline(always)]
fn overlapping<const W: usize>(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    let head: [u8; W] = src[..W].try_into().expect("W bytes");
    let tail: [u8; W] = src[n - W..].try_into().expect("W bytes");
    dst[..W].copy_from_slice(&head);
    dst[n - W..].copy_from_slice(&tail);
}

#[cfg(test)]
mod tests {
    #[test]
    fn copies_every_length_exactly() {
        let src: Vec<u8> = (0..200).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=130 {
            let mut dst = vec![0xAAu8; n + 2];
            super::copy(&mut dst[1..n + 1], &src[5..5 + n]);
            assert_eq!(&dst[1..n + 1], &src[5..5 + n], "length {n}");
            assert_eq!((dst[0], dst[n + 1]), (0xAA, 0xAA), "length {n} wrote outside its slice");
        }
    }
}
