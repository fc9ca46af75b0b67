"""Data-parallel training of a small GPT, one "rung" of an optimisation ladder at a time.

    PYTHON=.venv/bin/python target/release/conflux run -n 2 examples/ladder/train.py \\
        --rung 1 --steps 20 --out /tmp/r1.json

The model, the data, the optimizer and the update are the same on every rung; only the way the
gradients are averaged across ranks changes (see README.md):

    1 baseline  one blocking all_reduce per parameter after backward
    2 fusion    gradients flattened into ~--bucket-mb buckets, one blocking all_reduce per bucket
    3 link      the fusion code; the driver lets conflux pick shared memory / hierarchical
                algorithms (rungs 1-2 are meant to run with CONFLUX_TRANSPORT=tcp)
    4 async     each bucket all-reduced asynchronously as soon as backward has produced its
                gradients; all waited for before optimizer.step()
    5 sched     as 4, but nothing is waited for after backward: each bucket is waited for, and
                the optimizer applied to its parameters, just before the next step's forward
                first needs them (forward pre-hooks), overlapping step k's communication with
                step k+1's forward; buckets start in a fixed order (--hold-mb, --early-mb),
                gradients are views of the bucket buffers, buckets alternate over --lanes groups

Rank 0 writes --out (JSON) and prints one line ending in "ladder ok".
"""

import argparse
import json
import math
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

try:
    import conflux

    mark_step = conflux.mark_step  # a no-op when nothing is traced (and under gloo)
except ImportError:  # the script also runs where only torch is installed (gloo)
    def mark_step():
        return 0

NAMES = {1: "baseline", 2: "fusion", 3: "link", 4: "async", 5: "sched"}

VOCAB, D_MODEL, HEADS, LAYERS, SEQ = 2048, 256, 4, 4, 32
LR, MOMENTUM = 0.05, 0.9

# Seconds this rank spent blocked in torch.distributed (blocking calls, Work.wait) since the
# timed steps began: the "comm share" a backend without a trace (gloo) can report.
BLOCKED = [0.0]


def blocking(call, *args):
    t = time.perf_counter()
    call(*args)
    BLOCKED[0] += time.perf_counter() - t


# ----------------------------------------------------------------------------- model

class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x MLP."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """Every parameter lives in a leaf module (Embedding, Linear, LayerNorm) that runs its own
    forward: rung 5 relies on it (a module's pre-hook sees all the parameters it will use)."""

    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(SEQ, D_MODEL)
        self.blocks = nn.ModuleList(Block(D_MODEL, HEADS) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)  # untied from self.tok
        for m in self.modules():  # GPT-2's initialisation
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


# ----------------------------------------------------------------------------- data

class MarkovTokens:
    """A fixed synthetic token stream with learnable structure: each token is followed by one
    of 4 fixed successors (drawn once from seed 1234) with probabilities .7/.15/.1/.05, so the
    best achievable loss is about 0.9 nats against ln(2048) = 7.6 at the start."""

    def __init__(self):
        g = torch.Generator().manual_seed(1234)
        self.successors = torch.randint(VOCAB, (VOCAB, 4), generator=g)
        self.cum = torch.tensor([0.7, 0.85, 0.95])

    def global_batch(self, step, rows):
        """The step's whole batch, (rows, SEQ + 1) tokens, identical on every rank."""
        g = torch.Generator().manual_seed(1000 + step)
        toks = torch.empty(rows, SEQ + 1, dtype=torch.long)
        toks[:, 0] = torch.randint(VOCAB, (rows,), generator=g)
        for t in range(1, SEQ + 1):
            choice = (torch.rand(rows, generator=g).unsqueeze(1) > self.cum).sum(1)
            toks[:, t] = self.successors[toks[:, t - 1], choice]
        return toks

    def shard(self, step, rank, world, b):
        """Rank `rank`'s rows rank*b..(rank+1)*b of the step's global batch: inputs, targets."""
        rows = self.global_batch(step, b * world)[rank * b:(rank + 1) * b]
        return rows[:, :-1], rows[:, 1:]


# ----------------------------------------------------------------------------- buckets

def make_buckets(params, bucket_mb):
    """Parameters in reverse order (the order backward produces their gradients), packed into
    buckets closed as soon as they reach bucket_mb megabytes (a bucket may be larger: one
    tensor is never split)."""
    cap = bucket_mb * 1e6
    buckets, cur, size = [], [], 0
    for p in reversed(params):
        cur.append(p)
        size += p.numel() * p.element_size()
        if size >= cap:
            buckets.append(cur)
            cur, size = [], 0
    if cur:
        buckets.append(cur)
    return buckets


def make_buckets_small_front(params, bucket_mb, front_mb):
    """As make_buckets, but the first parameters of the model (the shortest prefix in forward
    order reaching front_mb; here the token embedding) get a bucket of their own, the last one
    issued. The next forward needs it first; being small, it finishes soon after backward."""
    if front_mb <= 0:
        return make_buckets(params, bucket_mb)
    cut, size = 0, 0
    while cut < len(params) and size < front_mb * 1e6:
        size += params[cut].numel() * params[cut].element_size()
        cut += 1
    return make_buckets(params[cut:], bucket_mb) + make_buckets(params[:cut], front_mb)


def issue_order(buckets, hold_mb, early_mb):
    """The order buckets start in, by index (0: the first backward produces, needed last by the
    next forward). The first hold_mb MB are held back; the next early_mb MB start as backward
    produces them (the link would idle otherwise); the rest, and then the held ones, start in
    the order the next forward needs them."""
    mb = [sum(p.numel() * p.element_size() for p in b) / 1e6 for b in buckets]

    def prefix(start, limit):
        end, size = start, 0.0
        while end < len(buckets) and size + mb[end] <= limit + 1e-9:
            size += mb[end]
            end += 1
        return end
    hold = prefix(0, hold_mb)
    early = prefix(hold, early_mb)
    return list(range(hold, early)) + [i for i in reversed(range(len(buckets))) if not hold <= i < early]


def copy_back(flat, bucket, world):
    """Averages a summed flat bucket and writes it back into its parameters' .grad."""
    flat.div_(world)
    for p, g in zip(bucket, _unflatten_dense_tensors(flat, [p.grad for p in bucket])):
        p.grad.copy_(g)


# ----------------------------------------------------------------------------- rungs

def baseline(model, world, **_):
    """Rung 1: after backward, one blocking all_reduce per parameter (HCCL's "wrong" loop)."""
    def sync():
        for p in model.parameters():
            blocking(dist.all_reduce, p.grad)
            p.grad.div_(world)
    return sync


def fusion(model, world, bucket_mb, **_):
    """Rung 2: after backward, one blocking all_reduce per ~bucket_mb bucket of gradients."""
    buckets = make_buckets(list(model.parameters()), bucket_mb)

    def sync():
        for bucket in buckets:
            flat = _flatten_dense_tensors([p.grad for p in bucket])  # torch.cat of reshape(-1)s
            blocking(dist.all_reduce, flat)
            copy_back(flat, bucket, world)
    sync.buckets = buckets
    return sync


def link(model, world, bucket_mb, **_):
    """Rung 3: the fusion code; what changes is the transport/algorithm the environment lets
    conflux choose (rungs 1-2 run with CONFLUX_TRANSPORT=tcp, this one with conflux's auto)."""
    return fusion(model, world, bucket_mb)


class AsyncBuckets:
    """Rung 4's machinery: a post-accumulate-grad hook on every parameter counts the bucket's
    ready gradients; once a bucket is whole and its turn in `order` has come, it is flattened
    (or already is, with views) and its async all_reduce starts on the next of `groups`."""

    def __init__(self, params, buckets, world, order=None, groups=(None,)):
        self.buckets, self.world, self.groups = buckets, world, groups
        self.order = list(range(len(buckets))) if order is None else order
        self.flats = None
        self.bucket_of = {p: i for i, b in enumerate(buckets) for p in b}
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in params]  # once
        self.reset()

    def use_views(self):
        """Makes every .grad a view of its bucket's one flat buffer (as DDP's
        gradient_as_bucket_view): backward accumulates straight into what is all-reduced, no
        flatten before nor copy back after."""
        self.flats = []
        for b in self.buckets:
            flat = torch.zeros(sum(p.numel() for p in b))
            at = 0
            for p in b:
                p.grad = flat[at:at + p.numel()].view_as(p)
                at += p.numel()
            self.flats.append(flat)

    def reset(self):
        """Per-step state: called before each backward."""
        self.ready = [0] * len(self.buckets)
        self.issued = 0  # how many of self.order have started
        self.pending = {}  # bucket index -> (flat tensor, Work)

    def _ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        # Buckets start in self.order, the same on every rank: a bucket ready before its turn
        # waits for the ones ahead of it.
        while self.issued < len(self.order):
            j = self.order[self.issued]
            if self.ready[j] < len(self.buckets[j]):
                break
            if self.flats is not None:
                flat = self.flats[j]
            else:
                flat = _flatten_dense_tensors([q.grad for q in self.buckets[j]])
            group = self.groups[self.issued % len(self.groups)]
            self.pending[j] = (flat, dist.all_reduce(flat, group=group, async_op=True))
            self.issued += 1

    def finish(self, i):
        """Waits for bucket i and averages its gradients: in place with views, else written
        back from the flat copy."""
        flat, work = self.pending.pop(i)
        blocking(work.wait)
        if self.flats is not None:
            flat.div_(self.world)
        else:
            copy_back(flat, self.buckets[i], self.world)

    def finish_all(self):
        assert len(self.pending) == len(self.buckets), "a bucket never became ready"
        for i in sorted(self.pending):
            self.finish(i)


def async_buckets(model, world, bucket_mb, **_):
    """Rung 4: buckets all-reduced during backward; all waited for before optimizer.step()."""
    params = list(model.parameters())
    ab = AsyncBuckets(params, make_buckets(params, bucket_mb), world)

    def sync():
        ab.finish_all()
    sync.before_backward = ab.reset
    sync.buckets = ab.buckets
    return sync


class Scheduled:
    """Rung 5: communication scheduling. After backward nothing is waited for; each bucket has
    its own SGD (same lr/momentum: per element the same update as one SGD over everything). A
    forward pre-hook on every module owning parameters, before that module's forward in the
    next step, waits for the bucket(s) holding its parameters, averages the gradients, steps
    that bucket's optimizer and clears its gradients. flush() does it for whatever is left
    (after the last step, so the final parameters are right)."""

    def __init__(self, model, world, bucket_mb, front_mb, hold_mb, early_mb, lanes):
        params = list(model.parameters())
        buckets = make_buckets_small_front(params, bucket_mb, front_mb)
        # More than one lane: buckets alternate over groups, each its own conflux communicator
        # with its own engine, so a bucket's reduce can run while the one before it waits on a
        # slower rank.
        groups = [None] + [dist.new_group() for _ in range(lanes - 1)]
        self.ab = AsyncBuckets(params, buckets, world, issue_order(buckets, hold_mb, early_mb), groups)
        self.ab.use_views()
        self.opts = [torch.optim.SGD(b, lr=LR, momentum=MOMENTUM) for b in self.ab.buckets]
        for m in model.modules():
            own = [self.ab.bucket_of[p] for p in m.parameters(recurse=False)]
            if own:
                m.register_forward_pre_hook(lambda _m, _inp, own=sorted(set(own)): self.apply(own))

    def apply(self, indices):
        for i in indices:
            if i in self.ab.pending:
                self.ab.finish(i)
                self.opts[i].step()
                self.ab.flats[i].zero_()  # the next backward accumulates into it

    def flush(self):
        self.apply(sorted(self.ab.pending))

    def before_backward(self):
        self.flush()  # normally nothing: the forward has applied every bucket
        self.ab.reset()


# ----------------------------------------------------------------------------- driver

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rung", type=int, choices=sorted(NAMES), required=True)
    ap.add_argument("--backend", default="conflux", choices=["conflux", "gloo"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--bucket-mb", type=float, help="bucket size, MB (default: 4; rung 5: 1)")
    ap.add_argument("--front-mb", type=float, default=1.0,
                    help="rung 5: the first parameters' own (last) bucket, MB; 0: plain buckets")
    ap.add_argument("--hold-mb", type=float, default=2.2,
                    help="rung 5: the first MB backward produces start last (the next forward needs "
                         "them last)")
    ap.add_argument("--early-mb", type=float, default=6.4,
                    help="rung 5: the next MB start as backward produces them; the rest in the order "
                         "the next forward needs them")
    ap.add_argument("--lanes", type=int, default=2, help="rung 5: groups the buckets alternate over")
    ap.add_argument("--out", help="rank 0 writes the result here (JSON)")
    args = ap.parse_args()

    torch.set_num_threads(1)  # ranks share the cores
    dist.init_process_group(backend=args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)  # the same initial model on every rank
    model = GPT()
    params = list(model.parameters())
    data = MarkovTokens()

    if args.bucket_mb is None:
        args.bucket_mb = 1.0 if args.rung == 5 else 4.0
    opt = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM)
    if args.rung == 5:
        sched = Scheduled(model, world, args.bucket_mb, args.front_mb, args.hold_mb, args.early_mb,
                          args.lanes)
        before_backward, after_backward, flush = sched.before_backward, None, sched.flush
        buckets = sched.ab.buckets
    else:
        sync = {1: baseline, 2: fusion, 3: link, 4: async_buckets}[args.rung](
            model, world, bucket_mb=args.bucket_mb)
        before_backward = getattr(sync, "before_backward", None)
        after_backward, flush = sync, None
        buckets = getattr(sync, "buckets", None)

    warmup = min(args.warmup, args.steps - 1) if args.steps > 1 else 0
    losses = []
    t0 = None
    for step in range(args.steps):
        if step == warmup:
            dist.barrier()
            t0 = time.perf_counter()
            BLOCKED[0] = 0.0
        mark_step()
        x, y = data.shard(step, rank, world, args.batch)
        logits = model(x)  # rung 5: the pre-hooks apply last step's updates here
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        if before_backward is not None:
            before_backward()
        loss.backward()
        if after_backward is not None:  # rungs 1-4: average, then one optimizer step
            after_backward()
            opt.step()
            opt.zero_grad()
        losses.append(loss.detach())
    if flush is not None:
        flush()  # rung 5: the last step's updates
    mark_step()
    dist.barrier()
    elapsed = time.perf_counter() - t0
    timed = args.steps - warmup

    # The global batch's mean loss (the ranks' shards are the same size), first and last step.
    both = torch.stack([losses[0], losses[-1]]).double()
    dist.all_reduce(both)
    both /= world
    with torch.no_grad():
        norm = math.sqrt(sum(float(p.double().pow(2).sum()) for p in params))

    if rank == 0:
        result = {
            "rung": args.rung, "name": NAMES[args.rung], "backend": args.backend, "world": world,
            "steps": args.steps, "samples_per_s": args.batch * world * timed / elapsed,
            "final_loss": float(both[1]), "loss_first": float(both[0]),
            "params": sum(p.numel() for p in params), "tensors": len(params),
            "buckets": len(buckets) if buckets else None, "param_norm": norm,
            "comm_share_self": BLOCKED[0] / elapsed,
            "transport": os.environ.get("CONFLUX_TRANSPORT", "auto") if args.backend == "conflux" else None,
        }
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
        print(f"rung {args.rung} {NAMES[args.rung]} {args.backend} world {world}: "
              f"loss {result['loss_first']:.4f} -> {result['final_loss']:.6f}, "
              f"{result['samples_per_s']:.1f} samples/s over {timed} steps, "
              f"{result['params']} params in {result['tensors']} tensors, ladder ok", flush=True)
    if args.backend == "gloo":
        # gloo's teardown has been seen to abort on this machine (see tests/workers/ddp.py).
        dist.barrier()
        os._exit(0)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
