/* The C ABI of conflux's native module (crates/conflux-py/src/capi.rs), for the C++ torch
 * backend: one table of functions, handed over as the PyCapsule `conflux._native.c_api()`,
 * and communicator handles, `Comm.c_handle()`, each owned by its taker until `release`.
 *
 * Every call goes through `call`: blocking when `done` is NULL (the outcome is in `out` when it
 * returns), else issued asynchronously: `call` returns 0 and `done(ctx, outcome)` runs exactly
 * once when the operation is over, on whichever thread completes it (conflux's progress engine,
 * or the caller's if it completed at once); it must not block. A nonzero return means nothing
 * was issued and `out` says why; `done` will not run. */
#ifndef CONFLUX_C_H
#define CONFLUX_C_H

#include <stdbool.h>
#include <stdint.h>

#define CFX_API_VERSION 3

/* Operation kinds. */
enum {
  CFX_ALL_REDUCE = 0,   /* bufs[0] in place */
  CFX_BROADCAST = 1,    /* bufs[0] in place, from `peer` (the root) */
  CFX_REDUCE = 2,       /* bufs[0] in place, the result at `peer` (the root) */
  CFX_ALL_GATHER = 3,   /* bufs[0]: size blocks, this rank's already in place */
  CFX_REDUCE_SCATTER = 4, /* bufs[0]: size blocks; afterwards block `rank` holds the result */
  CFX_ALL_TO_ALL_V = 5, /* bufs[0] send, bufs[1] recv, send_counts/recv_counts: size entries */
  CFX_SEND = 6,         /* bufs[0] to `peer`, `tag` */
  CFX_RECV = 7,         /* bufs[0] from `peer`, `tag` */
  CFX_RECV_ANY = 8,     /* bufs[0] from whichever rank sends first with `tag`: outcome.source */
  CFX_BARRIER = 9,
  CFX_ALL_REDUCE_COALESCED = 10 /* bufs[0..nbufs] in place, as one message */
};

/* Element types: conflux's DataType::ALL order. Booleans travel as CFX_U8. */
enum { CFX_F32 = 0, CFX_F64, CFX_F16, CFX_BF16, CFX_I8, CFX_U8, CFX_I16, CFX_I32, CFX_I64 };

/* Reductions: conflux's ReduceOp::ALL order. */
enum { CFX_SUM = 0, CFX_PROD, CFX_MIN, CFX_MAX, CFX_AVG, CFX_BAND, CFX_BOR, CFX_BXOR };

/* Outcome codes, as the Python package's exception classes. */
enum {
  CFX_OK = 0,
  CFX_INVALID_ARGUMENT = 1, /* conflux.errors.InvalidArgument */
  CFX_TIMEOUT = 2,          /* CommTimeout */
  CFX_PEER_ERROR = 3,       /* PeerError */
  CFX_MISMATCH = 4,         /* MismatchError */
  CFX_CLOSED = 5,           /* ClosedError */
  CFX_OTHER = 6             /* ConfluxError */
};

typedef struct cfx_buf {
  void* ptr;
  uint64_t count; /* elements */
} cfx_buf;

typedef struct cfx_call {
  uint32_t kind;
  uint32_t dtype;
  uint32_t op;
  uint32_t tag;
  int64_t peer;
  const cfx_buf* bufs;
  uint64_t nbufs;
  const uint64_t* send_counts;
  const uint64_t* recv_counts;
  uint64_t ncounts;
  uint64_t timeout_ms; /* this call's deadline; 0: the communicator's */
  /* Asynchronous calls on a traced communicator: if not NULL, receives a handle with which
   * the caller records its waits for the operation (trace_waited, trace_elsewhere), since
   * conflux cannot see them; NULL is written when nothing is traced. Give it back with
   * trace_release. */
  void** trace;
  /* Asynchronous calls: if not NULL, receives a handle with which a thread that waits for the
   * operation runs it itself (help) instead of sleeping until conflux's engine thread has run
   * it; NULL when the operation settled at once. Give it back with help_release. */
  void** help;
} cfx_call;

typedef struct cfx_outcome {
  int32_t code;
  int64_t peer;   /* the rank an error blames (job rank), or -1 */
  int64_t source; /* CFX_RECV_ANY: the rank the message came from, else -1 */
  uint64_t msg_len;
  char msg[1024]; /* the error's message, NUL-terminated (truncated if longer) */
} cfx_outcome;

typedef void (*cfx_done)(void* ctx, const cfx_outcome* outcome);

typedef struct cfx_api {
  uint32_t version;
  int32_t (*call)(const void* comm, const cfx_call* call, cfx_done done, void* ctx, cfx_outcome* out);
  void (*abort)(const void* comm);
  int32_t (*shutdown)(const void* comm, cfx_outcome* out);
  /* Gives back a handle from Comm.c_handle() (each call makes a new one); the communicator
   * shuts down when its last handle, Python's or C's, is gone. */
  void (*release)(const void* comm);
  /* The caller was blocked on the operation for `blocked_ns`, until now. */
  void (*trace_waited)(const void* trace, uint64_t blocked_ns);
  /* The caller will wait where nothing records it (a future waited inside torch). */
  void (*trace_elsewhere)(const void* trace);
  void (*trace_release)(const void* trace);
  /* Runs the operation behind `help` (and any issued before it) on this thread, while conflux's
   * engine thread has not taken it, until done(ctx) returns true or nothing more can be run
   * here; returns then, and the caller waits as before. A no-op once the communicator is gone. */
  void (*help)(const void* help, bool (*done)(void* ctx), void* ctx);
  void (*help_release)(const void* help);
} cfx_api;

#endif
