//! What an asynchronous operation may own while it runs.

use crate::dtype::Element;

/// A buffer an asynchronous operation takes, works on from the progress engine, and hands
/// back through its [`Work`](super::Work) when it completes. `Vec<T>` is one; a front end that
/// borrows memory owned elsewhere (a Python tensor, say) implements it on a handle that keeps
/// that memory alive until the operation gives the buffer back.
pub trait Buffer: Send + 'static {
    type Elem: Element;
    fn as_slice(&self) -> &[Self::Elem];
    fn as_mut_slice(&mut self) -> &mut [Self::Elem];
}

impl<T: Element> Buffer for Vec<T> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}

impl<T: Element> Buffer for Box<[T]> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        self
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        self
    }
}
