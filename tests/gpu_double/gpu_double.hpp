// The CUDA runtime + NCCL test double: what it models, its knobs, and where it is
// known (or not known) to differ from the real libraries.
//
// It is two shared libraries, built only for tests and never installed or linked
// into a binary: ${CMAKE_BINARY_DIR}/tests/gpu_double/lib/libcudart.so.13 (every
// cuda* symbol under the version node libcudart.so.13, as binaries linked against
// the real runtime reference them) and libnccl.so.2 (unversioned nccl* symbols). A
// test runs a normally built binary with LD_LIBRARY_PATH=<that directory>, which
// the loader searches before the binary's RUNPATH. They implement exactly the
// declarations of /usr/local/cuda/include (CUDA 13, NCCL 2.28) they are compiled
// against. This header declares the double's own exports; the rest is the text.
//
// ===================================================================================
// Knobs (environment, read once per process)
// ===================================================================================
//  DDP_GPU_DOUBLE_DEVICES=N   cudaGetDeviceCount gives N (default 4); 0: every device
//                             call answers cudaErrorNoDevice.
//  DDP_GPU_DOUBLE_FAULTS=f[@rank][=n],...
//                             `rank`: the rank given to ncclCommInitRank[Config]
//                             (communicators split from it count as that rank too);
//                             omitted: every rank. `n`: after how many accepted
//                             collective/p2p calls on that communicator (default 0),
//                             i.e. the fault hits call n+1. Faults with no
//                             communicator in scope (unique_id_error, stream_error)
//                             match @rank against the RANK environment variable.
//    init_hang        init answers ncclInProgress and never settles (a blocking
//                     init answers ncclInProgress too: it could not be aborted else).
//    init_error       init settles to ncclSystemError (blocking: returns it).
//    unique_id_error  ncclGetUniqueId returns ncclSystemError.
//    async_error      call n+1 is accepted but never completes (until abort), and
//                     from then ncclCommGetAsyncError reports ncclRemoteError (what
//                     NCCL reports when a peer across the network is lost); later
//                     calls return ncclRemoteError.
//    enqueue_error    call n+1 (and every later one) returns ncclSystemError; a
//                     non-blocking communicator's async state becomes it too.
//    enqueue_pending  call n+1 returns ncclInProgress and the communicator never
//                     settles: ncclCommGetAsyncError says ncclInProgress for good.
//    event_error      call n+1's work fails on its stream as a kernel fault does: the
//                     device's sticky error becomes cudaErrorLaunchFailure when the
//                     stream reaches it; nothing more runs on that device, and every
//                     event/stream query or synchronize on it answers that error.
//    split_error      ncclCommSplit fails: a blocking parent returns ncclSystemError;
//                     a non-blocking one answers ncclSuccess and its async state
//                     settles to ncclSystemError (*newcomm stays null).
//    split_hang       ncclCommSplit never completes: the parent reports ncclInProgress
//                     for good (a blocking parent answers ncclInProgress).
//    stream_error     cudaStreamCreate[WithFlags] returns cudaErrorMemoryAllocation.
//  DDP_GPU_DOUBLE_TRACE=1     one stderr line per NCCL call (debugging only).
//  DDP_GPU_DOUBLE_DELAY_US=N  every stream (the legacy ones too) pauses a random
//                             0..N microseconds before each task (default 0; at most
//                             1000000), so work that lacks a cross-stream dependency
//                             or a host wait runs late and fails its check.
//  Both libraries read the knobs: a malformed value is reported on stderr once by
//  each, so twice.
//
// ===================================================================================
// The CUDA runtime
// ===================================================================================
//  - Devices: N devices; cudaSetDevice/cudaGetDevice keep the current device per
//    thread (default 0), as CUDA does. Properties are not modelled.
//  - Memory: "device" memory is host memory the double owns that host code cannot
//    touch: each allocation is a memfd mapped twice, the address handed out
//    PROT_NONE (a host read or write of it is SIGSEGV, as a GPU pointer would fault),
//    and a readable alias the double's copies, fills and NCCL tasks use (tests may use
//    gpu_double_peek/poke). cudaMalloc records the current device, aligns to a page
//    (CUDA guarantees 256 bytes), and does not zero (as CUDA; a fresh memfd is zero,
//    so nothing shows uninitialised reads). A forked child gets a copy of its
//    parent's device memory at the same addresses (the double's choice: CUDA does not
//    support a child using its parent's context). A pointer not
//    from cudaMalloc/ncclMemAlloc is not device memory. cudaPointerGetAttributes:
//    device memory gives cudaMemoryTypeDevice and its device; anything else
//    cudaMemoryTypeUnregistered with device -2 (undocumented; what CUDA 13 answered
//    on an H200).
//  - cudaMemcpy and cudaMemset run on the legacy stream's queue. As in CUDA, cudaMemset
//    (device memory) and a device-to-device cudaMemcpy return at once without waiting
//    for it; a copy from or to host memory returns once done. CUDA may return from a
//    host-to-device copy out of pageable memory once the source is staged, and from
//    one out of pinned memory once done: the double always waits (it does not tell
//    pinned memory apart). The double checks the sides `kind` names: a HostToDevice copy
//    whose destination is not device memory (or overruns its allocation) is
//    cudaErrorInvalidValue; cudaMemcpyDefault checks nothing. Real CUDA with unified
//    addressing may accept some of these (stricter here on purpose).
//  - cudaFree returns at once: the pointer stops being device memory, and the memory
//    is released once every stream of its device passed the work queued before the
//    call (checked at each later cudaFree), so queued work never touches freed
//    memory. Real cudaFree synchronizes instead (and would wait for good behind an
//    operation whose peer is gone); the double does not block there.
//  - Streams: a stream is an in-order queue executed by a worker thread of its own.
//    The legacy default stream (0 / cudaStreamLegacy) is one per device;
//    cudaStreamPerThread is treated as the legacy stream (CUDA gives each thread its
//    own). The legacy stream's implicit synchronisation is modelled: work on it waits
//    for every blocking stream of its device, and work on a blocking stream waits for
//    it; streams created with cudaStreamNonBlocking do neither.
//  - cudaStreamQuery: cudaErrorNotReady while queued work remains. cudaStreamDestroy
//    returns at once; queued work still runs (as CUDA).
//  - Events mark a point in a stream's queue: cudaEventQuery answers
//    cudaErrorNotReady until the stream reached it, cudaSuccess for an event never
//    recorded (as CUDA); cudaEventSynchronize blocks until then. cudaStreamWaitEvent
//    makes a stream wait for that point (an event never recorded: no wait).
//    cudaEventElapsedTime measures host time between the points being reached.
//  - cudaLaunchHostFunc runs the function on the stream's worker thread in order.
//  - Errors: every failing call records the calling thread's last error
//    (cudaGetLastError returns and clears it, cudaPeekAtLastError only returns it);
//    cudaErrorNotReady is not recorded. After a kernel fault (event_error, or
//    gpu_double_fault_device) the device's sticky cudaErrorLaunchFailure is answered
//    by every call on that device: cudaMalloc, cudaFree (which still lets the memory
//    go), cudaMemcpy[Async], cudaMemset[Async], cudaStreamCreate, cudaEventCreate,
//    cudaEventRecord, cudaStreamWaitEvent, cudaLaunchHostFunc, the queries and
//    synchronizes; cudaGetLastError/cudaPeekAtLastError answer it for good (CUDA's
//    cannot clear it either). Work queued before the fault is skipped (host functions
//    do not run). Not modelled: cudaStreamDestroy/cudaEventDestroy still answer
//    cudaSuccess (CUDA's answer there is not known here), and CUDA's error is per
//    context, the double's per device. cudaGetErrorString/Name give the real texts
//    for the codes the double returns.
//  - Not modelled: kernels (no __cudaRegisterFatBinary: binaries with device code,
//    like the training kernels, do not load under the double), graphs, capture,
//    pinned-memory semantics (cudaMallocHost is plain memory), peer access, fork
//    after use (as CUDA: a child must not use what its parent initialised).
//
// ===================================================================================
// NCCL
// ===================================================================================
//  - Unique id: "gpudbl1\0" and 16 random bytes; the rest zero. Communicators are
//    keyed by the id's bytes: each has a POSIX shared-memory segment
//    /dev/shm/gpu_double_<hash of the id> that its ranks map, whether they are
//    processes or threads of one process. The segment is unlinked as soon as every
//    rank joined, and by abort/destroy before that; a test leaves no /dev/shm entry.
//    A segment whose joined ranks all died before the others came (SIGKILL) is
//    unlinked by the next init on the machine.
//  - Init: ncclCommInitRank[Config] joins the segment and waits for all ranks. With
//    config.blocking = 0 it answers ncclInProgress and settles in the background
//    (ncclCommGetAsyncError reports ncclInProgress, then ncclSuccess or the error).
//    Two ranks of one communicator on the same device of the same host (hostname and
//    network namespace: the project's multi-node tests run "hosts" in namespaces):
//    ncclInvalidUsage on every rank, as NCCL refuses duplicate GPUs (NCCL 2.28.3 on
//    an H200: both ranks, "Duplicate GPU detected" in ncclGetLastError).
//  - Calls: all_reduce, broadcast (and ncclBcast), reduce, all_gather,
//    reduce_scatter, send, recv. Each is checked (comm, dtype, op, root/peer range,
//    and that the buffers this rank uses are device memory large enough: a host
//    pointer is ncclInvalidArgument; real NCCL would fault on a short buffer instead,
//    and NCCL 2.28.3 on an H200 (one rank) accepted a malloc'd host pointer
//    without an error: the refusal is the double's, stricter than NCCL)
//    and enqueued onto the given stream; it runs there between the ranks through the
//    segment. Calls (and ncclCommSplit) while the communicator is still forming or
//    splitting: ncclInvalidArgument, as NCCL's ncclCommEnsureReady; the init's or
//    split's outcome then stands (NCCL stores the error as the async state too, and
//    the settling overwrites it: not checked on a GPU). After it failed: its error.
//  - A refused call poisons a NON-BLOCKING communicator, as NCCL 2.28.9 did on an
//    H200 (dtype 99, broadcast root 5 of 1): the call returns the error,
//    ncclCommGetAsyncError reports it from then on, and every later call (a valid
//    one too) and split return it. A BLOCKING communicator only returns it from that
//    call and stays usable (also seen there). The same holds for enqueue_error.
//    nccl_semantics_probe checks these facts: under the double in CI, and against
//    the real library in scripts/gpu-check (a FAIL there: this model is out of date).
//  - A group with a refused call (of any communicator) launches none of its calls:
//    the refused call returns its error, the others ncclSuccess, ncclGroupEnd
//    returns the first error (seen on an H200), and every non-blocking communicator
//    with calls in the group keeps that error (NCCL's group cleanup does so; seen
//    for the communicator of the refused call only). Whether NCCL runs a group's
//    valid calls is not known; its source discards them, as the double does.
//  - A non-blocking communicator's first launched call (or group) answers
//    ncclInProgress, which NCCL may answer while it connects peers in the background;
//    the double has already settled it (ncclCommGetAsyncError says ncclSuccess).
//    Later calls answer ncclSuccess. Not known for several ranks: NCCL 2.28.3 on an
//    H200 answered ncclSuccess to the first all_reduce of a one-rank communicator.
//    The double answers ncclInProgress so that callers' settling path runs.
//  - Order: as NCCL, one communicator's operations run in the order they were
//    issued, whatever streams they were given: each task waits for the one issued
//    before it on that communicator (its stream waits on the communicator's last
//    point). Work of other communicators is not ordered with it.
//  - Groups: ncclGroupStart/End (nestable) fuse the calls between them into one task
//    per communicator that progresses all its sends and receives together, so
//    gather/scatter/all_to_all written as send/recv loops do not deadlock. Calls of
//    one group on several streams join them (the task waits for each stream's earlier
//    work, and each stream's later work waits for the task). Sends to and receives
//    from oneself are matched in order within the group.
//  - Matching: calls are matched by their position on each pair of ranks, as NCCL
//    does. Mismatched calls (different op, count or dtype at the same position) stay
//    pending or deliver garbage, like a hang or corruption in real NCCL; the double
//    does not pretend to detect them.
//  - Types: int8, uint8, int32, uint32, int64, uint64, f16, bf16, f32, f64. fp8
//    (ncclFloat8e4m3/e5m2) is refused with ncclInvalidArgument. Ops: sum, prod, min,
//    max, avg; ncclRedOpCreatePreMulSum ops are not implemented (ncclInvalidArgument).
//  - Arithmetic: every rank reduces in rank order 0..n-1, so all ranks get identical
//    bits. Integers wrap on overflow. f16/bf16 are reduced in float and rounded to
//    nearest even once; NCCL rounds after each step of its ring/tree, so a sum of
//    more than two f16/bf16 values may differ in the last bit. avg: integers sum then
//    divide (truncating), which is what NCCL does for integer types (its
//    SumPostDiv); floats sum then divide, where NCCL multiplies each input by 1/n
//    first (PreMulSum), so the last bit may differ.
//  - Split: ncclCommSplit exchanges (color, key) through the parent's segment; ranks
//    of one color form a child ordered by (key, parent rank); NCCL_SPLIT_NOCOLOR gives
//    *newcomm = nullptr. As in NCCL 2.28 (read from its source, and seen on an H200
//    with NCCL 2.28.3 for a color and for NCCL_SPLIT_NOCOLOR), the call answers
//    ncclSuccess even for a non-blocking parent: *newcomm stays null until the split
//    completed, the parent reports ncclInProgress until then, and the child is
//    stored to *newcomm from the background before the parent reports the outcome.
//    The child uses the parent's device and the config's blocking (default: the
//    parent's).
//  - Peers that die or never call: the survivors' operations stay pending (their
//    events never fire), as NCCL's do. The double has no timeouts of its own.
//  - ncclCommAbort ends every wait of that communicator at once (pending operations
//    finish early: their events fire, as NCCL's abort ends its kernels; queued ones
//    run as no-ops), joins its background work and frees it. A split in progress
//    sees its parent's abort within 100 ms. ncclCommDestroy first waits for the
//    communicator's queued operations (for good if a peer is gone, as NCCL), then
//    frees it. ncclCommFinalize waits for them; a non-blocking communicator answers
//    ncclInProgress and reports the flush through ncclCommGetAsyncError (as NCCL
//    2.28.3 did on an H200); a second finalize is ncclInvalidArgument. An abort
//    cuts a non-blocking finalize's flush short, even one waiting behind other
//    work on its stream (the flush polls its events every millisecond for that).
//  - Waiting costs no CPU: waits sleep on a futex in the segment (a few yields
//    first) and every change meant for a rank wakes it.
//  - ncclGetLastError gives the process's last error text (as NCCL, one for all
//    threads). ncclMemAlloc and ncclMemFree allocate device memory on the current
//    device. ncclGetVersion reports NCCL_VERSION_CODE of the headers.
//  - Init inside ncclGroupStart/End: NCCL defers it to ncclGroupEnd, so one thread
//    may form several ranks with blocking inits in a group. The double does not
//    defer: a blocking init in a group waits for its peers at once, and one thread
//    forming several ranks that way deadlocks (use config.blocking = 0, or a thread
//    per rank). Not fixed.
//  - Resources: a communicator's segment is nranks² channels of 256 KiB plus slots,
//    sparse in /dev/shm (pages are touched as data flows; at most 4 MiB for 4 ranks,
//    1 GiB for 64, held while any rank maps it), so /dev/shm must allow that.
//    "Hosts" made with network namespaces share the real host's /dev/shm, which is how
//    they reach each other; host_identity() (hostname + network namespace) is what
//    keeps their devices apart. The stale-segment sweep probes a dead rank with
//    kill(pid, 0), which assumes every rank shares one PID namespace (true for the
//    project's tests; in separate PID namespaces a segment might be swept while live
//    ranks use it, or kept after they died).
//  - Not implemented: ncclCommInitAll, ncclCommInitRankScalable, ncclCommShrink,
//    ncclCommRevoke, buffer/window registration, user-defined ops; binaries using
//    them do not load under the double.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

extern "C" {
// "ddprun gpu double 1": tests look it up with dlsym(RTLD_DEFAULT, ...) to know
// they run under the double (the real runtime has no such symbol).
const char* gpu_double_version();
// Fails `device` as a kernel fault does (sticky cudaErrorLaunchFailure). For the
// NCCL double, called from a task on the stream; returns 0.
int gpu_double_fault_device(int device);
// Device memory for ncclMemAlloc/ncclMemFree; nullptr / -1 on failure.
void* gpu_double_alloc(size_t size, int device);
int gpu_double_free(void* p);
// The device of the allocation holding [p, p + bytes), or -1.
int gpu_double_device_of(const void* p, size_t bytes);
// Where the double itself reads and writes `p`: the readable alias of device memory
// (whose own address is PROT_NONE), `p` itself for any other pointer.
void* gpu_double_host_view(const void* p);
// Copies between host memory and device memory at once, outside every stream (for
// tests that look at device memory without a cudaMemcpy); -1 when `device_*` is not
// device memory of `bytes` bytes.
int gpu_double_peek(void* dst, const void* device_src, size_t bytes);
int gpu_double_poke(void* device_dst, const void* src, size_t bytes);
// How many cudaFree'd allocations still wait for queued work before they go.
int gpu_double_pending_frees();
// cudaLaunchHostFunc, where `drop(data)` runs instead of `fn(data)` when the stream
// skips the task (after a kernel fault), so that `data` is not leaked.
int gpu_double_launch_host_func(cudaStream_t stream, void (*fn)(void*), void* data, void (*drop)(void*));
}
