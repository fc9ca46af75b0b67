//! Single-copy reads from a local peer's memory: Linux's cross-memory attach
//! (`process_vm_readv`), which Open MPI's shared-memory transport uses for large messages.
//!
//! Through a ring a block is copied twice, into the ring by its sender and out by its
//! receiver; read straight from the sender's buffer, once. Open MPI's all_to_all of 4 MiB at 4
//! ranks on 2 cores took 0.77 ms here with it, 3.0 ms without
//! (`--mca btl_vader_single_copy_mechanism none`, 4 alternating runs).
//!
//! The kernel lets a process read another only with ptrace's permission: the same user, and
//! what Yama's `ptrace_scope` and a container's seccomp filter allow. Every rank lets any
//! process of its user read it (`PR_SET_PTRACER_ANY`, as Open MPI does), and a refusal is not
//! an error: the reader then asks the sender for the block through the ring
//! (`algo/by_ref.rs`). The sender's buffer must stay as it is until the reader says it is
//! done; that is the algorithm's part.

use std::sync::Once;

use super::{LinkError, Transport};

/// Makes every read refused, as a kernel that forbids them would (the fallback's test). Other
/// tests running meanwhile then take the fallback too, which gives the same results.
#[cfg(test)]
pub(crate) static REFUSE_FOR_TEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How a read from a peer's memory went.
pub(crate) enum PeerRead {
    /// The bytes are in the destination.
    Done,
    /// The kernel refused this process the read (permission, or no such system call): the
    /// bytes must come another way.
    Refused,
}

/// Lets any process of this user read this one's memory (Yama's `ptrace_scope = 1` allows only
/// a process's ancestors otherwise). Where there is no Yama, the call fails and nothing is
/// needed.
pub(crate) fn allow_peer_reads() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustix::process::set_ptracer(rustix::process::PTracer::Any);
    });
}

impl Transport {
    /// Whether this rank may read `peer`'s memory: a local peer over shared memory, with single
    /// copy on (`CONFLUX_SINGLE_COPY`). The kernel may still refuse (`read_peer`).
    pub(crate) fn can_read_peer(&self, peer: usize) -> bool {
        self.links.get(peer).and_then(Option::as_ref).is_some_and(|l| l.pid.is_some())
    }

    /// Reads `dst.len()` bytes at address `addr` of local peer `peer`'s memory into `dst`. The
    /// peer must keep those bytes as they are until told this read is over. Fails if the peer
    /// is gone or the address is not mapped there; the exchange it runs in
    /// (`Transport::exchange_then`) makes that the transport's failure.
    pub(crate) fn read_peer(&mut self, peer: usize, addr: u64, dst: &mut [u8]) -> Result<PeerRead, LinkError> {
        let Some(pid) = self.links.get(peer).and_then(Option::as_ref).and_then(|l| l.pid) else {
            return Ok(PeerRead::Refused);
        };
        #[cfg(test)]
        if REFUSE_FOR_TEST.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(PeerRead::Refused);
        }
        let mut done = 0;
        while done < dst.len() {
            let rest = &mut dst[done..];
            let local = libc::iovec { iov_base: rest.as_mut_ptr().cast(), iov_len: rest.len() };
            let remote = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: rest.len() };
            // SAFETY: `local` describes `rest`, memory this function holds exclusively (a
            // `&mut` borrow) for the whole call, so the kernel may write any of its bytes.
            // `remote` is an address in the peer's process, never dereferenced here: the kernel
            // checks it against the peer's mappings and fails with EFAULT where it is not mapped.
            // One iovec each, as the counts say.
            let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            let e = if n == 0 {
                LinkError::Io { peer, detail: format!("read {done} of {} bytes from its memory", dst.len()) }
            } else {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EPERM | libc::EACCES | libc::ENOSYS) if done == 0 => return Ok(PeerRead::Refused),
                    Some(libc::EINTR) => continue,
                    Some(libc::ESRCH) => LinkError::PeerGone { peer, detail: "its process is gone".into() },
                    _ => LinkError::Io { peer, detail: format!("reading its memory: {err}") },
                }
            };
            return Err(e);
        }
        Ok(PeerRead::Done)
    }
}
