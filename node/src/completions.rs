//! Promises settled from the core's runtime through ONE threadsafe function per JavaScript
//! environment. napi-rs's deferred creates, registers and finalizes a threadsafe function per
//! promise, and each settle wakes the JavaScript thread on its own; a profile of the JavaScript
//! thread at 64 concurrent locks put 17 % of its samples in that per-promise setup and 19 % in
//! the dispatch (issue 32). Here a runtime thread queues the outcome and wakes the JavaScript
//! thread only if no wake-up is already on its way, and the dispatch settles everything queued
//! by then (Node does the same for its own threadsafe functions; Neon since
//! neon-bindings/neon#727).
//!
//! The event loop is kept alive exactly as before: the threadsafe function is referenced while
//! at least one of this environment's promises is pending (counted on the JavaScript thread,
//! which creates and settles them all) and unreferenced when the last one settles, so a
//! script exits on its own. A promise whose future is dropped unfinished (a panic on the
//! runtime) is rejected, not left pending with the loop held open.

use std::cell::RefCell;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};

use napi::bindgen_prelude::ToNapiValue;
use napi::{Env, sys};

use crate::env::locked;
use crate::errors::coded;

/// Makes an outcome's value on the JavaScript thread: (true, value) resolves, (false, value)
/// rejects.
type Settle = Box<dyn FnOnce(sys::napi_env) -> (bool, napi::Result<sys::napi_value>) + Send>;

/// A raw deferred: only ever used on its environment's JavaScript thread (settled in the
/// dispatch), moved through the queue by runtime threads.
struct Deferred(sys::napi_deferred);
// SAFETY: the pointer is only dereferenced by napi on the JavaScript thread that created it.
unsafe impl Send for Deferred {}

type Outcome = (Deferred, Settle);

#[derive(Clone, Copy)]
struct TsfnPtr(sys::napi_threadsafe_function);
// SAFETY: calling a threadsafe function from any thread is what it is for; the `tsfn` mutex
// keeps it from being called once the environment's teardown has released it.
unsafe impl Send for TsfnPtr {}

/// One environment's completion queue, shared with the runtime threads that settle into it.
/// Pushing takes no lock (a channel): a mutex here was 5 % of the JavaScript thread's samples
/// at 64 concurrent locks, contended by the runtime thread pushing while the dispatch drained.
pub struct Completions {
    env: usize,
    outcomes: mpsc::Sender<Outcome>,
    /// Read on the JavaScript thread only (the mutex is never contended; it makes the
    /// receiver shareable).
    ready: Mutex<mpsc::Receiver<Outcome>>,
    /// A wake-up is on its way: the dispatch will take whatever is queued by then.
    scheduled: AtomicBool,
    /// None once the environment is torn down. Locked only to schedule a wake-up (once per
    /// batch) and by the teardown, which releases the function under it.
    tsfn: Mutex<Option<TsfnPtr>>,
    /// The environment is gone, and its promises with it: outcomes are dropped.
    closed: AtomicBool,
    /// Promises of this environment not settled yet (touched on the JavaScript thread only).
    pending: AtomicUsize,
}

thread_local! {
    /// This thread's environment's queue (Node runs one environment per thread).
    static CURRENT: RefCell<Option<Arc<Completions>>> = const { RefCell::new(None) };
}

impl Completions {
    /// This environment's queue, made (with its threadsafe function and teardown hook) on
    /// first use.
    fn of(env: &Env) -> napi::Result<Arc<Completions>> {
        let id = env.raw() as usize;
        if let Some(found) = CURRENT.with(|c| c.borrow().as_ref().filter(|q| q.env == id).cloned())
        {
            return Ok(found);
        }
        let made = Completions::new(env)?;
        CURRENT.with(|c| *c.borrow_mut() = Some(made.clone()));
        Ok(made)
    }

    fn new(env: &Env) -> napi::Result<Arc<Completions>> {
        let raw = env.raw();
        let (outcomes, ready) = mpsc::channel();
        let completions = Arc::new(Completions {
            env: raw as usize,
            outcomes,
            ready: Mutex::new(ready),
            scheduled: AtomicBool::new(false),
            tsfn: Mutex::new(None),
            closed: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
        });
        let mut name = ptr::null_mut();
        let label = "ferrolock";
        check(unsafe {
            sys::napi_create_string_utf8(
                raw,
                label.as_ptr().cast(),
                label.len() as isize,
                &mut name,
            )
        })?;
        // The context is a strong reference, given back in `finalized`.
        let context = Arc::into_raw(completions.clone()) as *mut c_void;
        let mut tsfn = ptr::null_mut();
        let created = check(unsafe {
            sys::napi_create_threadsafe_function(
                raw,
                ptr::null_mut(),
                ptr::null_mut(),
                name,
                0,
                1,
                ptr::null_mut(),
                Some(finalized),
                context,
                Some(dispatch),
                &mut tsfn,
            )
        });
        if let Err(e) = created {
            drop(unsafe { Arc::from_raw(context as *const Completions) });
            return Err(e);
        }
        // Nothing is pending yet: the loop may exit.
        check(unsafe { sys::napi_unref_threadsafe_function(raw, tsfn) })?;
        *locked(&completions.tsfn) = Some(TsfnPtr(tsfn));
        // Registered after the threadsafe function, so it runs before Node's own teardown of
        // it (cleanup hooks run in reverse order).
        check(unsafe {
            sys::napi_add_env_cleanup_hook(
                raw,
                Some(torn_down),
                Arc::as_ptr(&completions) as *mut c_void,
            )
        })?;
        Ok(completions)
    }

    /// A new pending promise of this environment, to settle with [`Pending::settle`].
    fn promise(self: &Arc<Self>, env: &Env) -> napi::Result<(Pending, sys::napi_value)> {
        let mut deferred = ptr::null_mut();
        let mut promise = ptr::null_mut();
        check(unsafe { sys::napi_create_promise(env.raw(), &mut deferred, &mut promise) })?;
        if self.pending.fetch_add(1, Ordering::Relaxed) == 0 {
            self.set_ref(env.raw(), true);
        }
        Ok((
            Pending {
                completions: self.clone(),
                deferred: Some(Deferred(deferred)),
            },
            promise,
        ))
    }

    fn set_ref(&self, env: sys::napi_env, referenced: bool) {
        if let Some(TsfnPtr(tsfn)) = *locked(&self.tsfn) {
            unsafe {
                if referenced {
                    sys::napi_ref_threadsafe_function(env, tsfn);
                } else {
                    sys::napi_unref_threadsafe_function(env, tsfn);
                }
            }
        }
    }

    /// Queues an outcome; wakes the JavaScript thread unless a wake-up is already on its way.
    fn push(&self, outcome: Outcome) {
        if self.closed.load(Ordering::Acquire) || self.outcomes.send(outcome).is_err() {
            return;
        }
        // AcqRel: the dispatch's swap back to false synchronizes with this one, so it sees
        // the outcome sent before.
        if self.scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        // With the mutex held: the teardown hook takes it before releasing the function.
        if let Some(TsfnPtr(tsfn)) = *locked(&self.tsfn) {
            unsafe {
                sys::napi_call_threadsafe_function(
                    tsfn,
                    ptr::null_mut(),
                    sys::ThreadsafeFunctionCallMode::nonblocking,
                )
            };
        }
    }

    /// On the JavaScript thread: settles everything queued.
    fn drain(&self, env: sys::napi_env) {
        // Cleared before draining: an outcome queued after this schedules its own wake-up.
        self.scheduled.swap(false, Ordering::AcqRel);
        let ready = locked(&self.ready);
        let mut settled = 0;
        while let Ok((Deferred(deferred), settle)) = ready.try_recv() {
            settled += 1;
            let mut scope = ptr::null_mut();
            if unsafe { sys::napi_open_handle_scope(env, &mut scope) } != sys::Status::napi_ok {
                continue;
            }
            settle_one(env, deferred, settle);
            unsafe { sys::napi_close_handle_scope(env, scope) };
        }
        drop(ready);
        if settled > 0 && self.pending.fetch_sub(settled, Ordering::Relaxed) == settled {
            self.set_ref(env, false);
        }
    }
}

fn settle_one(env: sys::napi_env, deferred: sys::napi_deferred, settle: Settle) {
    let (ok, value) = settle(env);
    let status = match value {
        Ok(v) if ok => unsafe { sys::napi_resolve_deferred(env, deferred, v) },
        Ok(v) => unsafe { sys::napi_reject_deferred(env, deferred, v) },
        // The value could not be made (a JavaScript exception is pending): reject with it.
        Err(e) => {
            let mut thrown = ptr::null_mut();
            let value = if unsafe { sys::napi_get_and_clear_last_exception(env, &mut thrown) }
                == sys::Status::napi_ok
                && !thrown.is_null()
                && !is_undefined(env, thrown)
            {
                Ok(thrown)
            } else {
                unsafe { ToNapiValue::to_napi_value(env, e) }
            };
            match value {
                Ok(v) => unsafe { sys::napi_reject_deferred(env, deferred, v) },
                Err(_) => sys::Status::napi_generic_failure,
            }
        }
    };
    let _ = status;
}

fn is_undefined(env: sys::napi_env, v: sys::napi_value) -> bool {
    let mut t = 0;
    (unsafe { sys::napi_typeof(env, v, &mut t) }) == sys::Status::napi_ok
        && t == sys::ValueType::napi_undefined
}

fn check(status: sys::napi_status) -> napi::Result<()> {
    if status == sys::Status::napi_ok {
        Ok(())
    } else {
        Err(coded(
            "REDIS_ERROR",
            &format!("ferrolock: napi call failed (status {status})"),
        ))
    }
}

/// The threadsafe function's call: the JavaScript thread drains the queue (env is null when
/// Node empties the function's own queue at teardown; nothing to do then).
unsafe extern "C" fn dispatch(
    env: sys::napi_env,
    _js_callback: sys::napi_value,
    context: *mut c_void,
    _data: *mut c_void,
) {
    if env.is_null() || context.is_null() {
        return;
    }
    let completions = unsafe { &*(context as *const Completions) };
    // A panic must not unwind out of a C callback (the process would abort); it is logged.
    let _ =
        ferrolock::host::panic_hook::catch("the completion dispatch", || completions.drain(env));
}

/// The environment's teardown: outcomes arriving from now on are dropped, and the threadsafe
/// function is released so that Node can finalize it.
unsafe extern "C" fn torn_down(data: *mut c_void) {
    let completions = unsafe { &*(data as *const Completions) };
    let _ =
        ferrolock::host::panic_hook::catch("the environment teardown", || tear_down(completions));
}

fn tear_down(completions: &Completions) {
    completions.closed.store(true, Ordering::Release);
    if let Some(TsfnPtr(tsfn)) = locked(&completions.tsfn).take() {
        unsafe {
            sys::napi_release_threadsafe_function(tsfn, sys::ThreadsafeFunctionReleaseMode::abort)
        };
    }
    // The outcomes queued so far go now (one pushed in a race with `closed` goes with the
    // queue, once the last promise's handle is dropped).
    let ready = locked(&completions.ready);
    while ready.try_recv().is_ok() {}
    drop(ready);
    let _ = CURRENT.try_with(|c| {
        let mut current = c.borrow_mut();
        if current.as_ref().is_some_and(|q| q.env == completions.env) {
            *current = None;
        }
    });
}

/// Node finalized the threadsafe function: gives back the context's reference.
unsafe extern "C" fn finalized(_env: sys::napi_env, _data: *mut c_void, context: *mut c_void) {
    if !context.is_null() {
        drop(unsafe { Arc::from_raw(context as *const Completions) });
    }
}

/// A promise not settled yet. Dropped unsettled (its future was dropped, e.g. by a panic on
/// the runtime), it rejects, so that no promise stays pending and holds the loop open.
pub struct Pending {
    completions: Arc<Completions>,
    deferred: Option<Deferred>,
}

impl Pending {
    pub fn settle<T: ToNapiValue + Send + 'static>(mut self, outcome: napi::Result<T>) {
        let Some(deferred) = self.deferred.take() else {
            return;
        };
        let settle: Settle = match outcome {
            Ok(v) => Box::new(move |env| (true, unsafe { T::to_napi_value(env, v) })),
            Err(e) => Box::new(move |env| (false, unsafe { ToNapiValue::to_napi_value(env, e) })),
        };
        self.completions.push((deferred, settle));
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(deferred) = self.deferred.take() {
            let e = coded("REDIS_ERROR", "ferrolock task ended without an outcome");
            self.completions.push((
                deferred,
                Box::new(move |env| (false, unsafe { ToNapiValue::to_napi_value(env, e) })),
            ));
        }
    }
}

/// A new pending promise of this environment (`rt::promise_on_core` settles it from the
/// core's runtime).
pub fn promise(env: &Env) -> napi::Result<(Pending, sys::napi_value)> {
    Completions::of(env)?.promise(env)
}
