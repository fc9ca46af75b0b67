//! `Parts`: a list of every local rank's bytes, kept on the stack for the usual handful of
//! ranks. The direct algorithm gathers one per call; at 8 bytes and 2 ranks, the two heap
//! lists it made per all_reduce were a measurable share of the call.

use std::ops::{Deref, DerefMut};

/// Ranks whose parts fit without a heap allocation.
const ON_STACK: usize = 8;

pub struct Parts<'a> {
    stack: [&'a [u8]; ON_STACK],
    len: usize,
    /// Used instead of `stack` when there are more parts than it holds.
    heap: Vec<&'a [u8]>,
}

impl<'a> FromIterator<&'a [u8]> for Parts<'a> {
    // Inlined, the list is built where the caller keeps it: returned, all 160 bytes were copied.
    #[inline]
    fn from_iter<I: IntoIterator<Item = &'a [u8]>>(iter: I) -> Parts<'a> {
        let mut p = Parts { stack: [&[]; ON_STACK], len: 0, heap: Vec::new() };
        for s in iter {
            if p.len < ON_STACK {
                p.stack[p.len] = s;
            } else {
                if p.heap.is_empty() {
                    p.heap.extend_from_slice(&p.stack);
                }
                p.heap.push(s);
            }
            p.len += 1;
        }
        p
    }
}

impl<'a> Deref for Parts<'a> {
    type Target = [&'a [u8]];
    fn deref(&self) -> &[&'a [u8]] {
        if self.len > ON_STACK {
            &self.heap
        } else {
            &self.stack[..self.len]
        }
    }
}

impl DerefMut for Parts<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        if self.len > ON_STACK {
            &mut self.heap
        } else {
            &mut self.stack[..self.len]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_part_in_order_on_the_stack_or_not() {
        for n in [0, 1, 7, 8, 9, 17] {
            let bytes: Vec<Vec<u8>> = (0..n).map(|k| vec![k as u8; k + 1]).collect();
            let mut p: Parts<'_> = bytes.iter().map(|b| &b[..]).collect();
            assert_eq!(p.len(), n);
            for (k, s) in p.iter().enumerate() {
                assert_eq!(*s, &bytes[k][..]);
            }
            if n > 0 {
                p[0] = &[];
                assert!(p[0].is_empty());
            }
        }
    }
}
