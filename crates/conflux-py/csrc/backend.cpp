// The torch.distributed backend "conflux" as a C++ c10d::Backend, as gloo's, torch-ccl's and
// torch_npu's are: torch calls it without going through Python, and its Work objects answer
// every question torch's Work interface asks (is_completed, is_success, exception,
// source_rank, a future that completes whether or not anybody waits).
//
// It reaches conflux through the C ABI of conflux._native (conflux_c.h): one `call` entry
// point for every operation, on a communicator handle the Python side makes. Tensors are
// passed by address; an operation keeps the tensors it uses alive until it is over. What
// conflux's operations do not do themselves (non-contiguous tensors, lists of tensors,
// PREMUL_SUM, booleans, gather/scatter) is done here with tensor copies, as the Python
// backend (conflux/torch.py) does: the two must stay equivalent.

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <functional>
#include <mutex>

#include "conflux_c.h"

// Hidden, as pybind11 advises for a module's own types (they hold py::objects).
namespace conflux_torch __attribute__((visibility("hidden"))) {

using c10d::OpType;
using c10d::ReduceOp;

const cfx_api* api = nullptr;

// ---------------------------------------------------------------------------- errors

// A conflux error: the code says which conflux.errors class Python sees (see the translator
// in the module's init), `peer` the rank it blames.
class Failure : public c10::DistBackendError {
 public:
  Failure(int32_t code, int64_t peer, const std::string& msg)
      : c10::DistBackendError({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, msg), code(code), peer(peer) {}
  int32_t code;
  int64_t peer;
};

[[noreturn]] void invalid(const std::string& msg) {
  throw Failure(CFX_INVALID_ARGUMENT, -1, "InvalidArgument: " + msg);
}

std::exception_ptr failure_of(const cfx_outcome& o) {
  return std::make_exception_ptr(Failure(o.code, o.peer, std::string(o.msg, o.msg_len)));
}

const char* class_of(int32_t code) {
  switch (code) {
    case CFX_INVALID_ARGUMENT: return "InvalidArgument";
    case CFX_TIMEOUT: return "CommTimeout";
    case CFX_PEER_ERROR: return "PeerError";
    case CFX_MISMATCH: return "MismatchError";
    case CFX_CLOSED: return "ClosedError";
    default: return "ConfluxError";
  }
}

// ---------------------------------------------------------------------------- tensors

uint32_t dtype_of(const at::Tensor& t) {
  if (!t.device().is_cpu()) invalid("conflux serves CPU tensors; this one is on " + t.device().str());
  switch (t.scalar_type()) {
    case at::kFloat: return CFX_F32;
    case at::kDouble: return CFX_F64;
    case at::kHalf: return CFX_F16;
    case at::kBFloat16: return CFX_BF16;
    case at::kChar: return CFX_I8;
    case at::kByte: return CFX_U8;
    case at::kBool: return CFX_U8;  // 0/1 bytes; the ops are mapped in op_of
    case at::kShort: return CFX_I16;
    case at::kInt: return CFX_I32;
    case at::kLong: return CFX_I64;
    default: invalid(std::string("conflux does not carry ") + c10::toString(t.scalar_type()));
  }
}

// The conflux op computing `op` on `t`, or PREMUL_SUM's factor in `factor` (then: SUM).
uint32_t op_of(const ReduceOp& op, const at::Tensor& t, std::optional<double>* factor) {
  bool boolean = t.scalar_type() == at::kBool;
  switch (op.op_) {
    case ReduceOp::SUM: return boolean ? CFX_MAX : CFX_SUM;
    case ReduceOp::MAX: return CFX_MAX;
    case ReduceOp::BOR: return boolean ? CFX_MAX : CFX_BOR;
    case ReduceOp::PRODUCT: return boolean ? CFX_MIN : CFX_PROD;
    case ReduceOp::MIN: return CFX_MIN;
    case ReduceOp::BAND: return boolean ? CFX_MIN : CFX_BAND;
    case ReduceOp::BXOR: return CFX_BXOR;
    case ReduceOp::AVG:
      if (boolean) invalid("reduce op AVG is not defined on bool");
      return CFX_AVG;
    case ReduceOp::PREMUL_SUM: {
      auto s = c10::static_intrusive_pointer_cast<c10d::PreMulSumSupplement>(op.supplement_);
      *factor = s->tensor_factor.defined() ? s->tensor_factor.item<double>() : s->double_factor;
      return boolean ? CFX_MAX : CFX_SUM;
    }
    default: invalid("conflux does not support this reduce op");
  }
}

cfx_buf buf_of(const at::Tensor& t) {
  return cfx_buf{t.numel() ? t.data_ptr() : nullptr, static_cast<uint64_t>(t.numel())};
}

// ---------------------------------------------------------------------------- one call's plan

// One conflux operation of a backend call, with what it reads and writes.
struct Step {
  cfx_call call{};
  std::vector<cfx_buf> bufs;
  std::vector<uint64_t> send_counts, recv_counts;

  Step(uint32_t kind, uint32_t dtype) {
    call.kind = kind;
    call.dtype = dtype;
  }
  const cfx_call* finish() {
    call.bufs = bufs.data();
    call.nbufs = bufs.size();
    call.send_counts = send_counts.empty() ? nullptr : send_counts.data();
    call.recv_counts = recv_counts.empty() ? nullptr : recv_counts.data();
    call.ncounts = send_counts.size();
    return &call;
  }
};

// A backend call: its steps, then the copies back into the caller's tensors (`finishers`),
// then the outputs the future completes with. `keep` holds every tensor a step touches.
struct Plan {
  std::vector<Step> steps;
  std::vector<std::function<void()>> finishers;
  std::vector<at::Tensor> keep;
  int64_t source = -1;  // a recv's known source

  // `t` contiguous: itself, or a copy that a finisher copies back.
  at::Tensor contig(const at::Tensor& t) {
    dtype_of(t);
    if (t.is_contiguous()) return t;
    at::Tensor c = t.contiguous();
    at::Tensor target = t;
    finishers.push_back([c, target]() mutable { target.copy_(c); });
    return c;
  }

  // A reduction of `t` in place (kind: all_reduce, reduce, ...). PREMUL_SUM scales a copy of a
  // caller's tensor, which a failed call must leave as it was; a `scratch` buffer of this
  // backend's own (a flattened list) is scaled where it is.
  Step& reducing(uint32_t kind, const at::Tensor& t, const ReduceOp& op, bool scratch = false) {
    std::optional<double> factor;
    uint32_t code = op_of(op, t, &factor);
    at::Tensor work = contig(t);
    if (factor) {
      if (!scratch && work.data_ptr() == t.data_ptr()) {
        work = t.clone();
        at::Tensor target = t;
        finishers.push_back([work, target]() mutable { target.copy_(work); });
      }
      work.mul_(*factor);
    }
    Step& s = add(kind, work);
    s.call.op = code;
    return s;
  }

  // After the steps: consecutive blocks of `flat` into `outs`, in order, each its size.
  void copy_back_in_order(const at::Tensor& flat, std::vector<at::Tensor> outs) {
    finishers.push_back([flat, outs]() mutable {
      int64_t at = 0;
      for (auto& o : outs) {
        o.copy_(flat.reshape(-1).slice(0, at, at + o.numel()).view_as(o));
        at += o.numel();
      }
    });
  }

  Step& add(uint32_t kind, const at::Tensor& t) {
    steps.emplace_back(kind, dtype_of(t));
    steps.back().bufs.push_back(buf_of(t));
    keep.push_back(t);
    return steps.back();
  }
};

// ---------------------------------------------------------------------------- Work

class ConfluxWork : public c10d::Work {
 public:
  ConfluxWork(int rank, OpType type, const char* title, const std::vector<at::Tensor>& inputs,
              std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type, title, std::optional<std::vector<at::Tensor>>(inputs)), outputs_(std::move(outputs)) {}

  int sourceRank() const override {
    std::lock_guard<std::mutex> g(mutex_);
    if (source_ < 0) return c10d::Work::sourceRank();  // raises torch's own error
    return static_cast<int>(source_);
  }

  std::vector<at::Tensor> result() override {
    return outputs_;
  }

  ~ConfluxWork() override {
    for (void* t : traces_) api->trace_release(t);
    for (void* h : helpers_) api->help_release(h);
  }

  // As torch's, but a wait that runs out raises conflux's CommTimeout (the operation goes on),
  // and a traced communicator's trace records how long the caller was blocked.
  bool wait(std::chrono::milliseconds timeout) override {
    // First run the operation here if conflux's engine thread has not taken it yet: waiting
    // right after issuing then costs no hand-off to that thread and back. Not for a wait with
    // a timeout, which must return when it runs out while the operation goes on.
    auto began = std::chrono::steady_clock::now();
    bool blocked = !isCompleted();
    if (blocked && timeout.count() == 0) {
      for (void* h : helpers_) api->help(h, &ConfluxWork::is_done, this);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    auto done = [this] { return completed_; };
    bool in_time = true;
    if (timeout.count() == 0) {  // torch's kNoTimeout
      cv_.wait(lock, done);
    } else {
      in_time = cv_.wait_for(lock, timeout, done);
    }
    if (blocked) {
      auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - began);
      for (void* t : traces_) api->trace_waited(t, static_cast<uint64_t>(ns.count()));
    }
    if (!in_time) {
      throw Failure(CFX_TIMEOUT, -1,
                    "CommTimeout: the operation did not complete within " + std::to_string(timeout.count()) + " ms");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }

  // Made on first request (most calls never get one: a blocking call's is never asked for),
  // settled at once if the call is over, else when it completes.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    bool settle;
    c10::intrusive_ptr<c10::ivalue::Future> f;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (future_) return future_;
      static const auto type = c10::ListType::create(c10::TensorType::get());
      future_ = c10::make_intrusive<c10::ivalue::Future>(type);
      // Whoever asks for the future (DDP) waits on it inside torch, where nothing records it.
      for (void* t : traces_) api->trace_elsewhere(t);
      f = future_;
      // Settled here only once the Work itself is complete (its profiler range ended, see
      // `complete`); asked for earlier, `complete` settles it.
      settle = settled_ && completed_;
      future_settled_here_ = settle;
    }
    if (settle) settle_future(f);
    return f;
  }

  // Issues the plan's steps; the Work completes when the last one does.
  void start(const void* comm, Plan plan) {
    plan_ = std::move(plan);
    source_ = plan_.source;
    left_ = static_cast<int64_t>(plan_.steps.size()) + 1;  // + this thread's, until all are issued
    for (Step& s : plan_.steps) {
      c10::raw::intrusive_ptr::incref(this);  // the callback's reference
      cfx_outcome out;
      void* trace = nullptr;
      void* help = nullptr;
      s.call.trace = &trace;
      s.call.help = &help;
      if (api->call(comm, s.finish(), &ConfluxWork::on_done, this, &out) != CFX_OK) {
        c10::intrusive_ptr<ConfluxWork>::reclaim(this);  // its callback will not run
        step_done(out);
      }
      if (trace) traces_.push_back(trace);
      if (help) helpers_.push_back(help);
    }
    cfx_outcome ok{};
    ok.source = -1;
    step_done(ok);
  }

  // A blocking call's Work: the plan already ran on this thread.
  void completed_now(Plan plan) {
    plan_ = std::move(plan);
    source_ = plan_.source;
    complete(nullptr);
  }

 private:
  static bool is_done(void* ctx) {
    return static_cast<ConfluxWork*>(ctx)->isCompleted();
  }

  static void on_done(void* ctx, const cfx_outcome* o) {
    auto self = c10::intrusive_ptr<ConfluxWork>::reclaim(static_cast<ConfluxWork*>(ctx));
    self->step_done(*o);
  }

  void step_done(const cfx_outcome& o) {
    bool last;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (o.code != CFX_OK && !error_) error_ = failure_of(o);
      if (o.source >= 0) source_ = o.source;
      last = --left_ == 0;
    }
    if (last) complete(error_);
  }

  // Runs once: the copies back (unless a step failed), the future, then the Work itself.
  void complete(std::exception_ptr error) {
    if (!error) {
      try {
        for (auto& f : plan_.finishers) f();
      } catch (...) {
        error = std::current_exception();
      }
    }
    plan_ = Plan();  // the tensors are the caller's again
    {
      std::lock_guard<std::mutex> g(mutex_);
      outcome_ = error;
      settled_ = true;
    }
    // The Work before its future: finish() ends the operation's torch.profiler range and
    // releases wait(), and a caller waiting on the future (DDP) may leave the profiler's region
    // the moment it is settled. A range ended after that wrote into a profile being torn down,
    // and freeing the profile crashed in kineto (about 1 job in 10 of the traced test).
    finish(error);
    c10::intrusive_ptr<c10::ivalue::Future> f;
    {
      std::lock_guard<std::mutex> g(mutex_);
      if (!future_settled_here_) f = future_;  // asked for before now; a later one settles itself
    }
    if (f) settle_future(f);
  }

  void settle_future(const c10::intrusive_ptr<c10::ivalue::Future>& f) {
    if (outcome_) {
      f->setError(outcome_);
    } else {
      f->markCompleted(c10::IValue(outputs_));
    }
  }

  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  Plan plan_;
  int64_t left_ = 0;
  int64_t source_ = -1;
  std::exception_ptr error_;
  std::vector<void*> traces_;   // the operations' wait trackers, when traced (filled by start)
  std::vector<void*> helpers_;  // what runs the operations on a waiting thread (filled by start)
  bool settled_ = false;        // the outcome is final (guarded by mutex_)
  bool future_settled_here_ = false;  // getFuture settled future_ itself (guarded by mutex_)
  std::exception_ptr outcome_;  // the call's error, once settled
};

// ---------------------------------------------------------------------------- Backend

class ConfluxBackend : public c10d::Backend {
 public:
  // `comm` is the Python conflux._native.Comm this group runs on; the backend keeps it (for
  // what stays in Python: link health) and a handle of its own on it.
  ConfluxBackend(py::object comm, int rank, int size)
      : c10d::Backend(rank, size), comm_(std::move(comm)) {
    handle_ = reinterpret_cast<const void*>(comm_.attr("c_handle")().cast<uintptr_t>());
  }

  ~ConfluxBackend() override {
    api->release(handle_);
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire gil;
      comm_ = py::object();
    } else {
      comm_.release();  // the interpreter is gone: nothing to give the reference back to
    }
  }

  const std::string getBackendName() const override {
    return "conflux";
  }

  py::object comm() const {
    return comm_;
  }

  void shutdown() override {
    cfx_outcome out;
    if (api->shutdown(handle_, &out) != CFX_OK) std::rethrow_exception(failure_of(out));
  }

  void abort() override {
    api->abort(handle_);
  }

  // -- new groups from this one (torch's split_group and shrink_group), made in Python
  // (conflux/torch.py `_split`, `_shrink`) on conflux's own split and shrink.

  bool supportsSplitting() const override {
    return true;
  }

  bool supportsShrinking() const override {
    return true;
  }

  // What splitGroup starts from when split_group is given no pg_options.
  c10::intrusive_ptr<c10d::Backend::Options> getBackendOptions() override {
    return c10::make_intrusive<c10d::Backend::Options>("conflux");
  }

  // torch's ProcessGroup::splitGroup calls this on every rank of the parent, each with the
  // parent ranks of its own new group, in the order given (a rank in none, with another
  // group's): that is conflux's collective split. nullptr for a rank outside `ranks`.
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& /*store*/,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<c10d::Backend::Options>& opts) override {
    double timeout = opts ? std::chrono::duration<double>(opts->timeout).count() : -1.0;
    py::gil_scoped_acquire gil;
    py::object made = py::module_::import("conflux.torch").attr("_split")(comm_, getRank(), ranks, timeout);
    if (made.is_none()) return nullptr;
    return made.cast<c10::intrusive_ptr<ConfluxBackend>>();
  }

  // torch's shrink_group: only the ranks that stay call it, each with the same exclusions.
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
                                           const c10::intrusive_ptr<c10d::Backend::Options>& /*opts*/) override {
    py::gil_scoped_acquire gil;
    py::object made = py::module_::import("conflux.torch").attr("_shrink")(comm_, ranks_to_exclude, shrink_flags);
    return made.cast<c10::intrusive_ptr<ConfluxBackend>>();
  }

  // -- collectives

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    Plan p;
    for (auto& t : tensors) p.reducing(CFX_ALL_REDUCE, t, opts.reduceOp);
    return run(OpType::ALLREDUCE, "conflux:all_reduce", tensors, tensors, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override {
    Plan p;
    if (!tensors.empty()) {
      at::Tensor flat = at::cat(flatten_all(tensors));
      p.reducing(CFX_ALL_REDUCE, flat, opts.reduceOp, true);
      p.copy_back_in_order(flat, tensors);
    }
    return run(OpType::ALLREDUCE_COALESCED, "conflux:all_reduce_coalesced", tensors, tensors, std::move(p),
               opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override {
    Plan p;
    check_root(opts.rootRank, "reduce");
    p.reducing(CFX_REDUCE, tensors.at(opts.rootTensor), opts.reduceOp).call.peer = opts.rootRank;
    return run(OpType::REDUCE, "conflux:reduce", tensors, tensors, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Plan p;
    check_root(opts.rootRank, "broadcast");
    for (auto& t : tensors) p.add(CFX_BROADCAST, p.contig(t)).call.peer = opts.rootRank;
    return run(OpType::BROADCAST, "conflux:broadcast", tensors, tensors, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    Plan p;
    if (outputs.size() != inputs.size()) invalid("all_gather: one output list per input tensor");
    for (size_t j = 0; j < inputs.size(); j++) all_gather_step(p, outputs[j], inputs[j]);
    return run(OpType::ALLGATHER, "conflux:all_gather", inputs, flat_list(outputs), std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& output_lists,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override {
    // torch's layout (as gloo's): output_lists[r][j] receives rank r's inputs[j].
    Plan p;
    if (output_lists.size() != static_cast<size_t>(size_)) {
      invalid("all_gather_coalesced: " + std::to_string(output_lists.size()) + " output lists for " +
              std::to_string(size_) + " ranks (one per rank)");
    }
    for (size_t j = 0; j < inputs.size(); j++) {
      std::vector<at::Tensor> per_rank;
      for (auto& outs : output_lists) {
        if (outs.size() != inputs.size()) invalid("all_gather_coalesced: each output list needs one tensor per input");
        per_rank.push_back(outs[j]);
      }
      all_gather_step(p, per_rank, inputs[j]);
    }
    return run(OpType::ALLGATHER_COALESCED, "conflux:all_gather_coalesced", inputs, flat_list(output_lists),
               std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override {
    Plan p;
    all_gather_single_step(p, output, input);
    return run(OpType::_ALLGATHER_BASE, "conflux:all_gather", {input}, {output}, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override {
    Plan p;
    if (outputs.size() != inputs.size()) invalid("all_gather_into_tensor_coalesced: as many outputs as inputs");
    for (size_t j = 0; j < inputs.size(); j++) all_gather_single_step(p, outputs[j], inputs[j]);
    return run(OpType::ALLGATHER_INTO_TENSOR_COALESCED, "conflux:all_gather_coalesced", inputs, outputs,
               std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& input_lists,
                                                const c10d::ReduceScatterOptions& opts) override {
    Plan p;
    if (outputs.size() != input_lists.size()) invalid("reduce_scatter: one input list per output tensor");
    for (size_t j = 0; j < outputs.size(); j++) {
      check_list(input_lists[j], outputs[j], "reduce_scatter");
      reduce_scatter_step(p, outputs[j], at::cat(flatten_all(input_lists[j])), opts.reduceOp);
    }
    return run(OpType::REDUCE_SCATTER, "conflux:reduce_scatter", flat_list(input_lists), outputs, std::move(p),
               opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override {
    Plan p;
    reduce_scatter_step(p, output, input.reshape(-1).clone(), opts.reduceOp);
    return run(OpType::_REDUCE_SCATTER_BASE, "conflux:reduce_scatter", {input}, {output}, std::move(p),
               opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override {
    Plan p;
    if (outputs.size() != inputs.size()) invalid("reduce_scatter_tensor_coalesced: as many outputs as inputs");
    for (size_t j = 0; j < outputs.size(); j++) {
      reduce_scatter_step(p, outputs[j], inputs[j].reshape(-1).clone(), opts.reduceOp);
    }
    return run(OpType::REDUCE_SCATTER_TENSOR_COALESCED, "conflux:reduce_scatter_coalesced", inputs, outputs,
               std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override {
    Plan p;
    at::Tensor send = input.contiguous();
    at::Tensor recv = p.contig(output);
    all_to_all_step(p, send, counts(input, input_splits), recv, counts(output, output_splits));
    return run(OpType::ALLTOALL_BASE, "conflux:all_to_all", {input}, {output}, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    Plan p;
    if (inputs.size() != static_cast<size_t>(size_) || outputs.size() != static_cast<size_t>(size_)) {
      invalid("all_to_all: one input and one output tensor per rank");
    }
    at::Tensor send = at::cat(flatten_all(inputs));
    std::vector<uint64_t> sc, rc;
    int64_t total = 0;
    for (auto& t : inputs) sc.push_back(t.numel());
    for (auto& t : outputs) {
      rc.push_back(t.numel());
      total += t.numel();
      if (t.scalar_type() != send.scalar_type()) invalid("all_to_all: inputs and outputs of different dtypes");
    }
    at::Tensor recv = at::empty({total}, send.options());
    all_to_all_step(p, send, sc, recv, rc);
    p.copy_back_in_order(recv, outputs);
    return run(OpType::ALLTOALL, "conflux:all_to_all", inputs, outputs, std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& output_lists,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override {
    Plan p;
    check_root(opts.rootRank, "gather");
    at::Tensor in = inputs.at(0).contiguous();
    uint64_t n = in.numel();
    std::vector<uint64_t> sc(size_, 0), rc(size_, 0);
    sc[opts.rootRank] = n;
    at::Tensor recv = at::empty({0}, in.options());
    if (rank_ == opts.rootRank) {
      std::vector<at::Tensor> outs = output_lists.at(0);
      check_list(outs, in, "gather");
      recv = at::empty({static_cast<int64_t>(n) * size_}, in.options());
      std::fill(rc.begin(), rc.end(), n);
      p.copy_back_in_order(recv, outs);
    }
    all_to_all_step(p, in, sc, recv, rc);
    return run(OpType::GATHER, "conflux:gather", inputs, flat_list(output_lists), std::move(p), opts.asyncOp, opts.timeout);
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& input_lists,
                                         const c10d::ScatterOptions& opts) override {
    Plan p;
    check_root(opts.rootRank, "scatter");
    at::Tensor out = outputs.at(0);
    at::Tensor recv = p.contig(out);
    uint64_t n = out.numel();
    std::vector<uint64_t> sc(size_, 0), rc(size_, 0);
    rc[opts.rootRank] = n;
    at::Tensor send = at::empty({0}, out.options());
    if (rank_ == opts.rootRank) {
      check_list(input_lists.at(0), out, "scatter");
      send = at::cat(flatten_all(input_lists.at(0)));
      std::fill(sc.begin(), sc.end(), n);
    }
    all_to_all_step(p, send, sc, recv, rc);
    return run(OpType::SCATTER, "conflux:scatter", flat_list(input_lists), outputs, std::move(p), opts.asyncOp, opts.timeout);
  }

  // -- point to point: always asynchronous, as torch's are

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    Plan p;
    for (auto& t : tensors) {
      Step& s = p.add(CFX_SEND, t.contiguous());
      s.call.peer = dst;
      s.call.tag = static_cast<uint32_t>(tag);
    }
    return run(OpType::SEND, "conflux:send", tensors, tensors, std::move(p), true);
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    Plan p;
    for (auto& t : tensors) {
      Step& s = p.add(CFX_RECV, p.contig(t));
      s.call.peer = src;
      s.call.tag = static_cast<uint32_t>(tag);
    }
    p.source = src;
    return run(OpType::RECV, "conflux:recv", tensors, tensors, std::move(p), true);
  }

  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    Plan p;
    if (tensors.size() != 1) invalid("recv from any source takes one tensor, not " + std::to_string(tensors.size()));
    p.add(CFX_RECV_ANY, p.contig(tensors[0])).call.tag = static_cast<uint32_t>(tag);
    return run(OpType::RECVANYSOURCE, "conflux:recv", tensors, tensors, std::move(p), true);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    Plan p;
    p.steps.emplace_back(CFX_BARRIER, CFX_U8);
    return run(OpType::BARRIER, "conflux:barrier", {}, {}, std::move(p), opts.asyncOp, opts.timeout);
  }

 private:
  // Blocking (`async` false: each step on this thread, then the copies back; the Work comes
  // back complete) or issued asynchronously.
  c10::intrusive_ptr<c10d::Work> run(OpType type, const char* title, const std::vector<at::Tensor>& inputs,
                                     std::vector<at::Tensor> outputs, Plan plan, bool async,
                                     std::chrono::milliseconds timeout = c10d::kUnsetTimeout) {
    if (timeout.count() > 0) {  // torch's per-call timeout, where its options set one
      for (Step& s : plan.steps) s.call.timeout_ms = static_cast<uint64_t>(timeout.count());
    }
    auto work = c10::make_intrusive<ConfluxWork>(rank_, type, title, inputs, std::move(outputs));
    if (async) {
      work->start(handle_, std::move(plan));
      return work;
    }
    // torch's bindings have released the GIL before calling a backend.
    for (Step& s : plan.steps) {
      cfx_outcome out;
      if (api->call(handle_, s.finish(), nullptr, nullptr, &out) != CFX_OK) std::rethrow_exception(failure_of(out));
    }
    work->completed_now(std::move(plan));  // runs the copies back, once
    if (work->exception()) std::rethrow_exception(work->exception());
    return work;
  }

  void check_root(int64_t root, const char* what) const {
    if (root < 0 || root >= size_) {
      invalid(std::string(what) + ": root " + std::to_string(root) + " is out of range for " + std::to_string(size_) +
              " ranks");
    }
  }

  void check_list(const std::vector<at::Tensor>& ts, const at::Tensor& like, const char* what) const {
    if (ts.size() != static_cast<size_t>(size_)) {
      invalid(std::string(what) + ": " + std::to_string(ts.size()) + " tensors for " + std::to_string(size_) +
              " ranks");
    }
    for (auto& t : ts) {
      if (t.numel() != like.numel() || t.scalar_type() != like.scalar_type()) {
        invalid(std::string(what) + ": a tensor of " + std::to_string(t.numel()) + " " +
                c10::toString(t.scalar_type()) + " where " + std::to_string(like.numel()) + " " +
                c10::toString(like.scalar_type()) + " was expected");
      }
    }
  }

  void all_gather_step(Plan& p, const std::vector<at::Tensor>& outs, const at::Tensor& in) {
    check_list(outs, in, "all_gather");
    int64_t n = in.numel();
    at::Tensor flat = at::empty({n * size_}, in.options());
    flat.slice(0, rank_ * n, (rank_ + 1) * n).copy_(in.reshape(-1));
    p.add(CFX_ALL_GATHER, flat);
    p.keep.push_back(in);
    p.copy_back_in_order(flat, outs);
  }

  void all_gather_single_step(Plan& p, const at::Tensor& output, const at::Tensor& input) {
    if (output.numel() != input.numel() * size_ || output.scalar_type() != input.scalar_type()) {
      invalid("all_gather_into_tensor: output has " + std::to_string(output.numel()) + " " +
              c10::toString(output.scalar_type()) + ", expected " + std::to_string(size_) + " x " +
              std::to_string(input.numel()) + " " + c10::toString(input.scalar_type()));
    }
    at::Tensor c = p.contig(output);
    int64_t n = input.numel();
    c.view(-1).slice(0, rank_ * n, (rank_ + 1) * n).copy_(input.reshape(-1));
    p.add(CFX_ALL_GATHER, c);
    p.keep.push_back(input);
  }

  // Reduce-scatters `flat` (size x n elements, clobbered) into `output`.
  void reduce_scatter_step(Plan& p, const at::Tensor& output, at::Tensor flat, const ReduceOp& op) {
    if (flat.numel() != output.numel() * size_ || flat.scalar_type() != output.scalar_type()) {
      invalid("reduce_scatter: input has " + std::to_string(flat.numel()) + " " + c10::toString(flat.scalar_type()) +
              ", expected " + std::to_string(size_) + " x " + std::to_string(output.numel()) + " " +
              c10::toString(output.scalar_type()));
    }
    p.reducing(CFX_REDUCE_SCATTER, flat, op, true);  // `flat` is this call's own
    int64_t n = output.numel();
    at::Tensor target = output;
    int64_t me = rank_;
    p.finishers.push_back([flat, target, n, me]() mutable {
      target.copy_(flat.slice(0, me * n, (me + 1) * n).view_as(target));
    });
  }

  std::vector<uint64_t> counts(const at::Tensor& t, const std::vector<int64_t>& splits) const {
    if (t.dim() == 0) invalid("all_to_all_single needs tensors with a first dimension");
    int64_t row = t.numel() / std::max<int64_t>(t.size(0), 1);
    if (t.size(0) == 0) row = 0;
    std::vector<uint64_t> out;
    if (splits.empty()) {
      if (t.size(0) % size_) {
        invalid("all_to_all_single: " + std::to_string(t.size(0)) + " rows do not split into " +
                std::to_string(size_) + " equal parts");
      }
      out.assign(size_, static_cast<uint64_t>(t.size(0) / size_ * row));
      return out;
    }
    if (splits.size() != static_cast<size_t>(size_)) {
      invalid("all_to_all_single: " + std::to_string(splits.size()) + " split sizes for " + std::to_string(size_) +
              " ranks");
    }
    for (int64_t s : splits) out.push_back(static_cast<uint64_t>(s * row));
    return out;
  }

  void all_to_all_step(Plan& p, const at::Tensor& send, std::vector<uint64_t> sc, const at::Tensor& recv,
                       std::vector<uint64_t> rc) {
    if (send.scalar_type() != recv.scalar_type()) {
      invalid(std::string("all_to_all: input is ") + c10::toString(send.scalar_type()) + ", output " +
              c10::toString(recv.scalar_type()));
    }
    Step& s = p.add(CFX_ALL_TO_ALL_V, send);
    s.bufs.push_back(buf_of(recv));
    s.send_counts = std::move(sc);
    s.recv_counts = std::move(rc);
    p.keep.push_back(recv);
  }

  static std::vector<at::Tensor> flatten_all(const std::vector<at::Tensor>& ts) {
    std::vector<at::Tensor> flat;
    for (auto& t : ts) flat.push_back(t.reshape(-1));
    return flat;
  }

  static std::vector<at::Tensor> flat_list(const std::vector<std::vector<at::Tensor>>& lists) {
    std::vector<at::Tensor> all;
    for (auto& l : lists) all.insert(all.end(), l.begin(), l.end());
    return all;
  }

  py::object comm_;
  const void* handle_;
};

// The group torch hands to users, with the backend serving its CPU tensors. Only so that the
// group names itself "conflux" where torch asks the group rather than its backend (DDP's
// logging data): a group made by torch for a backend registered by name says "custom".
class ConfluxProcessGroup : public c10d::ProcessGroup {
 public:
  ConfluxProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                      c10::intrusive_ptr<ConfluxBackend> backend)
      : c10d::ProcessGroup(std::move(store), rank, size) {
    setBackend(c10::DeviceType::CPU, BackendType::CUSTOM, backend);
    setDefaultBackend(BackendType::CUSTOM);
  }

  const std::string getBackendName() const override {
    return "conflux";
  }
};

}  // namespace conflux_torch

PYBIND11_MODULE(_c10d, m) {
  using namespace conflux_torch;
  m.doc() = "conflux's torch.distributed backend in C++ (see conflux/torch.py)";
  py::capsule cap = py::module_::import("conflux._native").attr("c_api")();
  api = static_cast<const cfx_api*>(cap.get_pointer());
  if (api == nullptr || api->version != CFX_API_VERSION) {
    throw std::runtime_error("conflux._c10d was built for another version of conflux._native: rebuild it");
  }
  // conflux's errors reach Python as the package's own classes (conflux.errors), with the
  // rank they blame, whether raised by a call, a Work's wait or its future's.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Failure& e) {
      py::object cls = py::module_::import("conflux.errors").attr(class_of(e.code));
      std::string msg = e.what_without_backtrace();
      auto colon = msg.find(": ");
      if (colon != std::string::npos && msg.compare(0, colon, class_of(e.code)) == 0) msg = msg.substr(colon + 2);
      py::object exc = cls(msg, e.peer >= 0 ? py::cast(e.peer) : py::none());
      PyErr_SetObject(cls.ptr(), exc.ptr());
    }
  });
  py::class_<ConfluxBackend, c10d::Backend, c10::intrusive_ptr<ConfluxBackend>>(m, "ConfluxBackend")
      .def(py::init<py::object, int, int>(), py::arg("comm"), py::arg("rank"), py::arg("size"))
      .def_property_readonly("comm", &ConfluxBackend::comm);
  py::class_<ConfluxProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<ConfluxProcessGroup>>(m, "ConfluxProcessGroup")
      .def(py::init<c10::intrusive_ptr<c10d::Store>, int, int, c10::intrusive_ptr<ConfluxBackend>>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"));
}
