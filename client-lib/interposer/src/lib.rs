//! `libgpushare_interpose.so`: runs an unmodified CUDA program as a *governed* client of
//! `gpushared` (`gpushare run -- COMMAND`, which preloads it with `LD_PRELOAD`).
//!
//! The program keeps its own CUDA context and calls the real driver; the interposer only asks
//! the broker for admission, over the same socket handshake and shared-memory rings as a
//! brokered client (`Role::Governed`):
//! - every device allocation (classic, pitched, managed, stream-ordered and pool, VMM
//!   physical memory) is reserved against the user's memory quota first; past it the program
//!   gets an ordinary `CUDA_ERROR_OUT_OF_MEMORY` and the driver is not called. Frees give the
//!   reservation back.
//! - every kernel launch (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative launches, graph
//!   launches, and their per-thread-default-stream variants) takes a token from a local budget
//!   that the broker grants under its scheduling policy (priority holds, TGS rate control), so
//!   a launch costs no round trip.
//! - synchronizations tell the broker the program's work is done.
//!
//! Programs find these entry points by linking libcuda, through `cuGetProcAddress` (the CUDA
//! runtime), or with `dlopen` + `dlsym`: [`lookup`] handles the last two. The real driver is
//! `$GPUSHARE_REAL_LIBCUDA` or `libcuda.so.1` ([`real`]).
//!
//! Without a broker its `cuInit` fails, and when it loses the broker its launches and
//! allocations wait for it to come back and then fail ([`standing`]); it runs without one
//! only when started to (`gpushare run --fallback direct`).
//! `GPUSHARE_INTERPOSE_DEBUG=1` makes it tell how the program reaches it ([`debug`]).

mod abi;
mod broker;
mod debug;
pub mod exports;
mod governor;
mod lookup;
mod real;
mod sizes;
mod standing;
