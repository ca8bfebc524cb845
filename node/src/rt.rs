//! Where the binding's work runs: on the core's process runtime (`ferrolock::runtime`), never
//! on napi's, which is torn down and rebuilt around environment teardown and would take the
//! connections and the watchdog with it. This is napi glue, not lock logic: the host layer's
//! `async` calls are driven here and their results handed to a JavaScript promise.

use std::future::Future;
use std::panic::AssertUnwindSafe;

use ferrolock::runtime::{AwaitedCalls, CallBatch};
use futures::FutureExt;

use napi::Env;
use napi::bindgen_prelude::{PromiseRaw, ToNapiValue};

use crate::errors::{PANIC, coded, guard};

/// Runs `fut` on the core's runtime and returns a promise of its result, settled from there
/// through this environment's completion queue (`completions`): one hop from the JavaScript
/// thread to a core worker and one back, shared by every outcome that lands before the
/// JavaScript thread gets to them (napi's `spawn_future` would add a hop through napi's own
/// runtime each way, a thread wake-up that costs more than a local Redis round trip on a VM).
///
/// `make` builds the future on the runtime, boxed there: what the JavaScript thread moves into
/// the task is the closure's captures, not the whole state machine (several kilobytes for an
/// acquire), whose copies were the JavaScript thread's largest cost at 64 concurrent locks.
///
/// A panic in the future rejects the promise with an error of code PANIC naming `entry`.
pub fn promise_on_core<'env, T, F, M>(
    env: &'env Env,
    entry: &'static str,
    make: M,
) -> napi::Result<PromiseRaw<'env, T>>
where
    T: ToNapiValue + Send + 'static,
    F: Future<Output = napi::Result<T>> + Send + 'static,
    M: FnOnce() -> F + Send + 'static,
{
    let (pending, promise) = crate::completions::promise(env)?;
    if CALLS.started() {
        ferrolock::runtime::runtime().spawn(CALLS.stay_awake());
    }
    BATCH.run(async move {
        let _settled = Settled;
        let run = AssertUnwindSafe(async move { Box::pin(make()).await });
        let outcome = run.catch_unwind().await.unwrap_or_else(|payload| {
            Err(coded(
                PANIC,
                &ferrolock::host::panic_hook::panicked(entry, &*payload),
            ))
        });
        pending.settle(outcome)
    });
    Ok(PromiseRaw::new(env.raw(), promise))
}

/// The binding's calls in flight, for the runtime worker's reply polling (DESIGN.md, "Reply
/// polling"): one process runtime serves every environment.
static CALLS: AwaitedCalls = AwaitedCalls::new();

/// Every environment's calls, polled in one task of the core's runtime (`runtime::CallBatch`:
/// their requests then go out a few per system call instead of one each).
static BATCH: CallBatch = CallBatch::new();

/// Counts a call settled when its task ends, however it ends.
struct Settled;

impl Drop for Settled {
    fn drop(&mut self) {
        CALLS.settled();
    }
}

/// Runs blocking host calls (`host::Manager::close`) on the core runtime's blocking pool.
pub async fn blocking_on_core<T, F>(f: F) -> napi::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    ferrolock::runtime::runtime()
        .spawn_blocking(f)
        .await
        .map_err(|e| coded("REDIS_ERROR", &format!("ferrolock task failed: {e}")))
}

/// Calls `f` with the core's runtime as the ambient one, so that whatever a new manager
/// spawns in the background (watchdog, waiters) lives there, whichever runtime napi has
/// entered on this thread.
pub fn in_core<T>(f: impl FnOnce() -> T) -> T {
    let _entered = ferrolock::runtime::runtime().enter();
    f()
}

/// An empty async call through the same path as every other (a promise resolved from the
/// core's runtime): the binding's own floor in `make bench`.
#[napi_derive::napi(js_name = "__benchNoop")]
pub fn bench_noop(env: &napi::Env) -> napi::Result<napi::bindgen_prelude::PromiseRaw<'_, ()>> {
    guard("__benchNoop", || {
        promise_on_core(env, "__benchNoop", || async { Ok(()) })
    })
}

/// Panics, for the tests that a panic reaches the logger and not stderr and becomes an error of
/// kind PANIC (nothing in the library panics on purpose). `place`: "runtime" (default) on one
/// of the core's runtime threads, resolving to the panic's text; "sync" on the JavaScript
/// thread inside this call; "async" inside the call's future on the runtime. Not exported by
/// `index.js`.
#[napi_derive::napi(js_name = "__panicForTest")]
pub fn panic_for_test(
    env: &napi::Env,
    place: Option<String>,
) -> napi::Result<PromiseRaw<'_, String>> {
    const ENTRY: &str = "__panicForTest";
    guard(ENTRY, || match place.as_deref().unwrap_or("runtime") {
        "sync" => panic!("{ENTRY} was called (sync)"),
        "async" => promise_on_core(env, ENTRY, || async {
            panic!("{ENTRY} was called (async)")
        }),
        _ => promise_on_core(env, ENTRY, || async {
            let task = ferrolock::runtime::runtime().spawn(async { panic!("{ENTRY} was called") });
            Ok(task
                .await
                .map(|()| String::new())
                .unwrap_or_else(|e| e.to_string()))
        }),
    })
}
