//! Memory that Python owns, seen from Rust as a slice of elements.
//!
//! The Python layer (`conflux/_buffers.py`) turns a tensor, an array or any buffer-protocol
//! object into `(address, count, dtype)` and keeps the object alive for as long as an
//! operation may touch it: for a blocking call the caller's frame does, for an asynchronous one
//! the completion callback holds it until the operation is over. `_native` is private for
//! that reason: like ctypes, it trusts the address it is given. A [`Region`] is made only
//! from such a triple, which is the invariant every slice made here rests on.

use std::ptr::NonNull;

use conflux::{Buffer, DataType, Element};
use pyo3::exceptions::PyValueError;
use pyo3::PyResult;

/// What Python passes for a buffer: (address, element count, dtype name).
pub type Triple = (usize, usize, String);

/// A region of a Python object's memory, as the Python layer describes it.
#[derive(Debug, Clone, Copy)]
pub struct Region {
    addr: usize,
    count: usize,
    dtype: DataType,
}

impl Region {
    pub fn parse(t: &Triple) -> PyResult<Region> {
        let (addr, count, dtype) = (t.0, t.1, t.2.as_str());
        let dtype = DataType::parse(dtype).ok_or_else(|| PyValueError::new_err(format!("unknown dtype {dtype:?}")))?;
        Region::new(addr, count, dtype).map_err(PyValueError::new_err)
    }

    /// A region from its parts, as the Python layer or the C++ backend (capi.rs) describe it.
    pub fn new(addr: usize, count: usize, dtype: DataType) -> Result<Region, String> {
        if count > 0 && addr == 0 {
            return Err("a non-empty buffer at address 0".into());
        }
        if !addr.is_multiple_of(dtype.size()) {
            return Err(format!("buffer at {addr:#x} is not aligned for {dtype}"));
        }
        Ok(Region { addr, count, dtype })
    }

    pub fn dtype(&self) -> DataType {
        self.dtype
    }
}

/// A [`Region`] typed as `T`: what the communicator's calls take.
pub struct Raw<T> {
    ptr: NonNull<T>,
    len: usize,
}

// SAFETY: a Raw is only an address and a length; the memory behind it is plain data owned by a
// Python object that the Python layer keeps alive until the operation using the Raw is over,
// and no Rust code touches it through any other path. Moving the handle to the engine thread
// is what an asynchronous operation needs.
unsafe impl<T: Element> Send for Raw<T> {}

impl<T: Element> Raw<T> {
    /// The region as elements of `T`, which must be its dtype.
    pub fn new(r: Region) -> PyResult<Raw<T>> {
        Raw::of(r).map_err(PyValueError::new_err)
    }

    /// `new` without Python's error type, for callers that hold no GIL (capi.rs).
    pub fn of(r: Region) -> Result<Raw<T>, String> {
        if r.dtype != T::DTYPE {
            return Err(format!("a {} buffer where {} was expected", r.dtype, T::DTYPE));
        }
        let ptr = NonNull::new(r.addr as *mut T).unwrap_or(NonNull::dangling());
        Ok(Raw { ptr, len: r.count })
    }
}

impl<T: Element> Buffer for Raw<T> {
    type Elem = T;
    fn as_slice(&self) -> &[T] {
        // SAFETY: a Region comes only from the Python layer's triple, whose object holds `len`
        // initialised elements of T (dtype checked in `new`) at this address, aligned (checked
        // in `Region::parse`), alive while the Raw is in use (module doc). An empty region
        // uses a dangling aligned pointer, which a zero-length slice allows.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`; `&mut self` makes this the only slice handed out from this
        // Raw, and the caller does not touch the object until the operation is over (the same
        // rule as torch's async_op=True).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}
