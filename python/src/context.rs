//! The `with` half of `ferrolock.LockContext` (the `async with` half is Python, in
//! `ferrolock/__init__.py`).
//!
//! `__exit__` is implemented here, in Rust, on purpose: a lock-lost exception injected into the
//! entering thread (`PyThreadState_SetAsyncExc`) fires at the next bytecode boundary, and a
//! Python-level `__exit__` has one at its very first instruction, where the injection would
//! abort the release. A C-level `__exit__` clears a pending injection before any bytecode
//! runs, under the GIL, so the watchdog's callback (which also holds the GIL) cannot race it.

use std::os::raw::c_long;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use ferrolock::host::{self, scope::Body, scope::ScopeEnd};
use ferrolock::{Error, ErrorKind, LockOptions, quoted_key};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyWeakrefMethods, PyWeakrefReference};

use crate::bridge;
use crate::errors::{injected_class, to_py};
use crate::lock::PyLock;
use crate::manager::PyManager;
use crate::options::{key_str, lock_kind};

#[derive(Default)]
struct State {
    lock: Option<Py<PyLock>>,
    entered: bool,
    /// Bumped on every enter and exit, so a late loss signal of an earlier use is ignored.
    generation: u64,
    /// `PyThread_get_thread_ident()` of the thread that entered.
    thread: u64,
    /// A weak reference to that thread's token (`ferrolock._owner.thread_token`), dead once
    /// the thread has ended: its ident may then be another thread's, which the block's loss
    /// must not be raised into (found by a review: a block entered by hand in a thread that
    /// ended inside it). None if the token could not be made (the ident alone is checked).
    alive: Option<Py<PyWeakrefReference>>,
    /// A coroutine's frame running the `with` statement (its address), else 0. A coroutine
    /// suspended at an `await` is not running: the thread's event loop runs other tasks, into
    /// which the loss must not be raised, so it waits until this frame is on the thread's
    /// stack again. Any other frame counts as running: a function entered by hand (an
    /// `ExitStack`) has returned to the code the block guards, and a generator's block (a
    /// `@contextmanager`'s) guards its caller's code while it is suspended.
    frame: usize,
    in_body: bool,
    /// An exception is pending in (or was raised into) the entering thread.
    injected: bool,
    /// The lock of the `async with` block in its body (its `HeldBlock` reads it): kept here,
    /// with the context, so that a block never exited does not keep its lock alive.
    async_lock: Option<Py<PyLock>>,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called with the GIL held, from a blocking-pool thread, when the watchdog declares
    /// the lock lost. True when the loss is still to be raised: the block is entered but
    /// suspended (its frame not on its thread's stack), so the caller tries again later.
    fn on_lost(&self, py: Python<'_>, generation: u64, interrupt: bool) -> bool {
        // (The core logs the loss itself, as a warning on the "ferrolock" logger.)
        let wanted =
            |st: &State| st.generation == generation && st.in_body && interrupt && !st.injected;
        let (thread, frame, alive) = {
            let st = self.state();
            if !wanted(&st) {
                return false;
            }
            (
                st.thread,
                st.frame,
                st.alive.as_ref().map(|a| a.clone_ref(py)),
            )
        };
        // Outside the state's mutex: walking the frames allocates, and a collection may run a
        // finalizer that exits this very block.
        let gone = alive.is_some_and(|a| a.bind(py).upgrade().is_none());
        let running = match frame {
            // The entering thread has ended: another thread may have its ident now.
            _ if gone => None,
            0 => Some(true),
            frame => running_on(py, thread, frame),
        };
        let mut st = self.state();
        if !wanted(&st) {
            return false;
        }
        match running {
            Some(true) => {}
            // Suspended: try again later.
            Some(false) => return true,
            // The thread is gone: nothing of the block runs any more.
            None => return false,
        }
        if let Ok(cls) = injected_class(py) {
            // SAFETY: called with the GIL held; `cls` is a live exception class.
            let n =
                unsafe { pyo3::ffi::PyThreadState_SetAsyncExc(st.thread as c_long, cls.as_ptr()) };
            st.injected = n == 1;
            if let Some(lock) = st.lock.as_ref().filter(|_| st.injected) {
                let lock = &lock.get().lock;
                let reason = lock.loss_reason().map_or_else(
                    || format!("{} {} was lost", lock.what(), quoted_key(lock.key())),
                    |r| r.to_string(),
                );
                let mut pending = injected_losses();
                pending.retain(|(t, _, _)| *t != st.thread);
                pending.push((st.thread, lock.key().to_string(), reason));
            }
        }
        false
    }
}

/// The loss each thread has an injected `LockLost` pending for: (thread ident, key, reason).
/// The interpreter makes the injected exception in that thread with no arguments (the C API
/// injects a class), and the class asks for its lock here (`_injected_loss`), so that one
/// raised inside the body (an inner block's, maybe) names the lock that was lost. A thread has
/// one pending injection at most: a later one replaces it, as the interpreter's does.
static INJECTED_LOSSES: Mutex<Vec<(u64, String, String)>> = Mutex::new(Vec::new());

fn injected_losses() -> MutexGuard<'static, Vec<(u64, String, String)>> {
    INJECTED_LOSSES.lock().unwrap_or_else(|p| p.into_inner())
}

/// The key and the loss reason of the `LockLost` injected into the calling thread, taken (see
/// `INJECTED_LOSSES`); None when there is none.
#[pyfunction]
pub fn _injected_loss() -> Option<(String, String)> {
    let here = thread_ident();
    let mut pending = injected_losses();
    let i = pending.iter().position(|(t, _, _)| *t == here)?;
    let (_, key, reason) = pending.remove(i);
    Some((key, reason))
}

/// The address of the calling Python frame if it is a coroutine's (or an async generator's),
/// else 0 (see `State::frame`).
fn coroutine_frame(py: Python<'_>) -> usize {
    const CO_COROUTINE: u32 = 0x0080;
    const CO_ITERABLE_COROUTINE: u32 = 0x0100;
    const CO_ASYNC_GENERATOR: u32 = 0x0200;
    // SAFETY: GIL held; a borrowed reference, used while it is the running frame.
    let frame = unsafe { pyo3::ffi::PyEval_GetFrame() };
    if frame.is_null() {
        return 0;
    }
    // SAFETY: a live frame object, borrowed for this call.
    let frame = unsafe { Bound::from_borrowed_ptr(py, frame.cast()) };
    let flags = frame
        .getattr("f_code")
        .and_then(|c| c.getattr("co_flags"))
        .and_then(|f| f.extract::<u32>())
        .unwrap_or(0);
    if flags & (CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR) != 0 {
        frame.as_ptr() as usize
    } else {
        0
    }
}

/// Whether `frame` is on the stack `thread` runs now; None once the thread is gone (or the
/// frames cannot be read).
fn running_on(py: Python<'_>, thread: u64, frame: usize) -> Option<bool> {
    let frames = py
        .import("sys")
        .and_then(|sys| sys.call_method0("_current_frames"))
        .ok()?;
    let mut f = frames.get_item(thread).ok()?;
    while !f.is_none() {
        if f.as_ptr() as usize == frame {
            return Some(true);
        }
        f = f.getattr("f_back").ok()?;
    }
    Some(false)
}

/// The `with` and `async with` blocks being run, weakly. An acquire that would wait for one of
/// them is refused at once, as Node's scopes refuse one from their own scope: an acquire by the
/// owner (thread) inside a `with` block of the key (for ever with the watchdog on); a blocking
/// acquire on the thread of an event loop whose `async with` block holds the key (the loop,
/// stopped, can never run the block to its exit); an awaited acquire on a thread inside a
/// `with` block of the key (the block cannot exit before that loop returns). Found by a
/// review: the last two hung for good, and so did a semaphore or a read-write lock asked for
/// inside a lock's block of its name, and a lock inside a read-write lock's.
static HELD_BLOCKS: Mutex<Vec<HeldBlock>> = Mutex::new(Vec::new());

/// What a block holds, or an acquire asks for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    Lock,
    Read,
    Write,
    /// `count` permits of a pool of `permits`.
    Permits {
        permits: u32,
        count: u32,
    },
}

impl Held {
    fn of(kind: host::Kind) -> Held {
        match kind {
            host::Kind::Read => Held::Read,
            host::Kind::Write => Held::Write,
            host::Kind::Permits { permits, count } => Held::Permits { permits, count },
            _ => Held::Lock,
        }
    }

    fn word(self) -> &'static str {
        match self {
            Held::Lock => "lock",
            Held::Read => "read lock",
            Held::Write => "write lock",
            Held::Permits { .. } => "semaphore",
        }
    }

    fn rw(self) -> bool {
        matches!(self, Held::Read | Held::Write)
    }

    /// Whether asking for `self` (`reentrant`: a reentrant lock) waits for a hold `found`
    /// (`found_reentrant`) of the same name for as long as that is held. `same_owner`: the
    /// hold's owner asks, through its own manager, where the core re-enters a read-write lock
    /// and refuses an upgrade, or a reentrant lock beside a read-write hold, itself.
    fn waits_for(
        self,
        found: Held,
        same_owner: bool,
        reentrant: bool,
        found_reentrant: bool,
    ) -> bool {
        match (self, found) {
            // The core refuses another kind on a semaphore's counter at once, and permits
            // beside permits may be granted (each entry is a holder of its own) while the
            // blocks leave enough (`refuse_waiting_for_itself` counts them).
            (_, Held::Permits { .. }) => false,
            // A semaphore waits for a lock of its name to go (a read-write hold's hash is
            // refused at once, as a key of the wrong type).
            (Held::Permits { .. }, Held::Lock) => true,
            (Held::Permits { .. }, _) => false,
            (Held::Lock, Held::Lock) => !(same_owner && reentrant && found_reentrant),
            (Held::Read, Held::Read) => false,
            (Held::Lock, _) => !(same_owner && reentrant),
            (_, Held::Lock) => !(same_owner && found_reentrant),
            _ => !same_owner,
        }
    }
}

/// How a repr names what `kind` holds: its word ("lock", "read lock", ...) and, for permits,
/// the pool (` permits=5 count=2`).
pub(crate) fn described(kind: host::Kind) -> (&'static str, String) {
    described_held(Held::of(kind))
}

fn described_held(held: Held) -> (&'static str, String) {
    let pool = match held {
        Held::Permits { permits, count } => format!(" permits={permits} count={count}"),
        _ => String::new(),
    };
    (held.word(), pool)
}

struct HeldBlock {
    /// `PyManager::id`: the host manager, shared by every `redlock()` on the same nodes.
    manager: usize,
    /// `PyManager::servers`: what the key is held on, however the nodes were written.
    servers: String,
    key: String,
    kind: Held,
    reentrant: bool,
    /// The thread's owner id (`ferrolock._owner`): unlike its ident, never reused (an `async
    /// with` block's: its task's).
    owner: u64,
    /// The thread the block runs on (an `async with` block's: its event loop's).
    thread: u64,
    /// The frame that entered a `with` block (its address; 0 for `async with`): code running
    /// with it on the stack runs inside the block.
    frame: usize,
    /// An `async with` block.
    asynchronous: bool,
    shared: Weak<Shared>,
}

impl HeldBlock {
    /// In its body, with its lock still held (a block whose lock was released early, lost or
    /// ran past its validity holds nothing to wait for).
    fn holds(&self) -> bool {
        self.shared.upgrade().is_some_and(|s| {
            let st = s.state();
            let lock = if self.asynchronous {
                st.async_lock.as_ref()
            } else {
                st.lock.as_ref().filter(|_| st.in_body)
            };
            lock.is_some_and(|l| l.get().lock.core().is_held())
        })
    }
}

fn held_blocks() -> MutexGuard<'static, Vec<HeldBlock>> {
    HELD_BLOCKS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Forgets the entries of `shared` (a block that exits, or enters again) and of blocks gone.
fn forget_block(shared: &Weak<Shared>) {
    held_blocks().retain(|b| !Weak::ptr_eq(&b.shared, shared) && b.shared.strong_count() > 0);
}

/// Refuses a blocking acquire of `asked` of `key` on `manager` by `owner` while it is inside a
/// `with` block that holds that key on the same servers, unless the owner re-enters (both
/// reentrant locks, or both sides of the read-write lock, on the same manager: through another
/// manager, options written apart, it is another owner). A block whose lock is no longer held
/// (released early, lost, past its validity) holds nothing to wait for.
pub(crate) fn refuse_waiting_for_itself(
    py: Python<'_>,
    manager: &PyManager,
    key: &str,
    asked: Held,
    reentrant: bool,
    owner: u64,
) -> PyResult<()> {
    let (servers, manager) = (manager.servers(), manager.id());
    let here = thread_ident();
    let (mut own_block, mut loops_block) = (None, false);
    // Permits of the pool asked for that this thread's blocks hold: they go back only when
    // those blocks exit, after this wait (`ferrolock run` counts its enclosing runs alike).
    let mut stuck = 0u32;
    for b in held_blocks().iter() {
        if b.servers != servers || b.key != key || !b.holds() {
            continue;
        }
        if let (Held::Permits { permits, .. }, Held::Permits { permits: p, count }) =
            (asked, b.kind)
            && p == permits
            && (b.asynchronous && b.thread == here || !b.asynchronous && b.owner == owner)
        {
            stuck = stuck.saturating_add(count);
        }
        if b.asynchronous {
            loops_block |= b.thread == here && asked.waits_for(b.kind, false, false, false);
        } else if b.owner == owner {
            let same = b.manager == manager;
            if asked.waits_for(b.kind, same, reentrant, b.reentrant) {
                own_block = Some(b.kind);
            }
        }
    }
    let what = match asked {
        Held::Permits { .. } => "semaphore",
        _ => "lock",
    };
    refuse_permits_held_by_blocks(
        py,
        key,
        asked,
        stuck,
        "this thread's `with` blocks (or its event loop's `async with` blocks) hold",
        "exit",
    )?;
    let why = if loops_block {
        "this thread runs the event loop of an `async with` block that holds it (on the same \
         servers): blocking here stops that loop, so the block could never release it; await \
         the acquire instead (`async with`, `await manager.acquire_async(...)`)"
    } else if own_block == Some(Held::Lock) && asked == Held::Lock {
        "this thread is inside a `with` block that holds it (on the same servers), so waiting \
         would deadlock; pass reentrant=True to both, with the same manager or connection \
         options, to re-enter"
    } else if let Some(found) = own_block {
        let owner = match found.rw() && asked.rw() {
            true => "; its owner re-enters only through the same manager or connection options",
            false => "",
        };
        let why = format!(
            "this thread is inside a `with` block that holds it as a {} (on the same servers), \
             which a {} of it waits for, so waiting would deadlock{owner}",
            found.word(),
            asked.word()
        );
        let err = Error::new(
            ErrorKind::NotAcquired,
            format!("{what} {} not acquired: {why}", quoted_key(key)),
        );
        return Err(to_py(py, &err, Some(key)));
    } else {
        return Ok(());
    };
    let err = Error::new(
        ErrorKind::NotAcquired,
        format!("{what} {} not acquired: {why}", quoted_key(key)),
    );
    Err(to_py(py, &err, Some(key)))
}

/// Refuses permits of a semaphore (`asked`) that the enclosing blocks, holding `stuck` of its
/// pool, leave too few of: they give theirs back only once they `end`, after this wait.
/// `blocks` says which blocks, with the verb ("... hold").
fn refuse_permits_held_by_blocks(
    py: Python<'_>,
    key: &str,
    asked: Held,
    stuck: u32,
    blocks: &str,
    end: &str,
) -> PyResult<()> {
    if let Held::Permits { permits, count } = asked
        && stuck > 0
        && count > permits.saturating_sub(stuck)
    {
        let err = Error::new(
            ErrorKind::NotAcquired,
            format!(
                "semaphore {shown} not acquired: {blocks} {stuck} of its {permits} permits (on \
                 the same servers), and this asks for {count}: they go back only when those \
                 blocks {end}, so waiting would deadlock",
                shown = quoted_key(key)
            ),
        );
        return Err(to_py(py, &err, Some(key)));
    }
    Ok(())
}

/// Refuses an awaited acquire of `asked` of `key` on `manager` on a thread inside a `with`
/// block that holds that key on the same servers: the event loop runs inside that block,
/// which cannot exit before the loop returns, so the wait would never end.
pub(crate) fn refuse_awaiting_an_enclosing_block(
    py: Python<'_>,
    manager: &PyManager,
    key: &str,
    asked: Held,
) -> PyResult<()> {
    let (servers, here) = (manager.servers(), thread_ident());
    // Each block's frame, and the permits of the pool asked for that it holds (0 for a hold
    // this waits for whatever is left).
    let enclosing: Vec<(usize, Option<u32>)> = held_blocks()
        .iter()
        .filter(|b| {
            !b.asynchronous && b.thread == here && b.servers == servers && b.key == key && b.holds()
        })
        .filter_map(|b| match (asked, b.kind) {
            (Held::Permits { permits, .. }, Held::Permits { permits: p, count }) => {
                (p == permits).then_some((b.frame, Some(count)))
            }
            _ => asked
                .waits_for(b.kind, false, false, false)
                .then_some((b.frame, None)),
        })
        .collect();
    // Only a block whose frame is on this stack runs the loop inside it: a `with` block in
    // another task's coroutine, suspended at an `await`, exits in its turn.
    let running: Vec<Option<u32>> = enclosing
        .into_iter()
        .filter(|&(frame, _)| running_on(py, here, frame) == Some(true))
        .map(|(_, permits)| permits)
        .collect();
    let what = match asked {
        Held::Permits { .. } => "semaphore",
        _ => "lock",
    };
    let stuck: u32 = running
        .iter()
        .flatten()
        .fold(0, |a, &c| a.saturating_add(c));
    refuse_permits_held_by_blocks(
        py,
        key,
        asked,
        stuck,
        "this thread runs this event loop inside `with` blocks that hold",
        "exit, after this wait",
    )?;
    if !running.iter().any(Option::is_none) {
        return Ok(());
    }
    let err = Error::new(
        ErrorKind::NotAcquired,
        format!(
            "{what} {shown} not acquired: this thread is inside a `with` block that holds it (on \
             the same servers) and runs this event loop inside it, so the block cannot release \
             it before this wait ends: waiting would deadlock",
            shown = quoted_key(key)
        ),
    );
    Err(to_py(py, &err, Some(key)))
}

/// Base class of `ferrolock.LockContext`: `with manager.lock(key) as lock:`.
#[pyclass(
    name = "_LockContextBase",
    module = "ferrolock._ferrolock",
    subclass,
    frozen
)]
pub struct PyLockContext {
    manager: Py<PyManager>,
    key: String,
    /// What it takes: a lock, a side of the read-write lock, or permits.
    held: Held,
    opts: LockOptions,
    interrupt: bool,
    shared: Arc<Shared>,
}

/// A weak reference to the calling thread's token (see `State::alive`); None if none can be
/// made. The call runs Python code, where a pending signal's handler runs: its exception
/// (Ctrl-C's `KeyboardInterrupt`) is returned, never dropped.
fn thread_token(py: Python<'_>) -> PyResult<Option<Py<PyWeakrefReference>>> {
    static THREAD_TOKEN: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let token = THREAD_TOKEN
        .import(py, "ferrolock._owner", "thread_token")?
        .call0()?;
    Ok(PyWeakrefReference::new(&token).ok().map(Bound::unbind))
}

fn thread_ident() -> u64 {
    // SAFETY: no preconditions.
    unsafe { pyo3::ffi::PyThread_get_thread_ident() as u64 }
}

impl PyLockContext {
    /// Records this context's block, in its body on this thread, in `HELD_BLOCKS` (replacing
    /// any earlier entry of it).
    fn record_block(&self, owner: u64, asynchronous: bool) {
        let shared = Arc::downgrade(&self.shared);
        forget_block(&shared);
        // SAFETY: GIL held (the caller's); only the address is kept.
        let frame = if asynchronous {
            0
        } else {
            unsafe { pyo3::ffi::PyEval_GetFrame() as usize }
        };
        held_blocks().push(HeldBlock {
            frame,
            manager: self.manager.get().id(),
            servers: self.manager.get().servers().to_string(),
            key: self.key.clone(),
            kind: self.held,
            reentrant: self.opts.reentrant,
            owner,
            thread: thread_ident(),
            asynchronous,
            shared,
        });
    }

    fn enter(&self, py: Python<'_>, entered_async: bool) -> PyResult<Py<PyLock>> {
        {
            let mut st = self.shared.state();
            if st.entered || entered_async {
                return Err(self.in_use(py));
            }
            st.entered = true;
        }

        // Everything that runs Python code runs before the acquire: a signal that arrives while
        // it waits and finds it granted is raised by the acquire (`acquire_blocking`), where a
        // Python call made after the grant swallowed it (Ctrl-C pressed as the lock came was
        // lost, and the body ran).
        let acquired = crate::lock::current_thread_owner(py).and_then(|owner| {
            let alive = thread_token(py)?;
            let (manager, reentrant) = (self.manager.get(), self.opts.reentrant);
            refuse_waiting_for_itself(py, manager, &self.key, self.held, reentrant, owner)?;
            self.manager
                .get()
                .acquire_blocking(py, &self.key, self.opts.clone(), owner)
                .map(|lock| (lock, owner, alive))
        });
        let (lock, owner, alive) = match acquired {
            Ok((l, owner, alive)) => (Py::new(py, l)?, owner, alive),
            Err(e) => {
                self.shared.state().entered = false;
                return Err(e);
            }
        };
        let generation = {
            let mut st = self.shared.state();
            st.generation += 1;
            st.lock = Some(lock.clone_ref(py));
            st.thread = thread_ident();
            st.alive = alive;
            st.frame = coroutine_frame(py);
            st.in_body = true;
            st.injected = false;
            st.generation
        };
        self.record_block(owner, false);
        // Weakly: the core lock keeps this callback, out of sight of Python's garbage
        // collector, and `shared` holds the lock; a strong reference would keep a context
        // dropped inside its block (an ExitStack never closed) and its lock renewed for ever.
        let (shared, interrupt) = (Arc::downgrade(&self.shared), self.interrupt);
        // The host runs this on a blocking-pool thread, never where the loss is declared.
        // While the block is suspended (a coroutine at an `await`: `State::frame`), the loss
        // waits until the block runs again or exits, checked every 20 ms at first, then less
        // often (up to every 250 ms: many blocks suspended through an outage must not crowd
        // the GIL their event loop needs).
        lock.get().lock.on_lost(move |_reason| {
            let mut pause = std::time::Duration::from_millis(20);
            loop {
                let mut again = false;
                bridge::attach_if_alive(|py| {
                    if let Some(shared) = shared.upgrade() {
                        again = shared.on_lost(py, generation, interrupt);
                    }
                });
                if !again {
                    break;
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(250));
            }
        });
        Ok(lock)
    }

    fn in_use(&self, py: Python<'_>) -> PyErr {
        // A semaphore's entries are holders of their own: there is nothing to re-enter.
        let (what, instead) = match self.held {
            Held::Permits { .. } => ("semaphore", "call manager.semaphore() again"),
            _ => ("lock", "call manager.lock() again, or use reentrant=True"),
        };
        crate::errors::invalid(
            py,
            format!(
                "{what} {}: this context is already entered; it can be reused after it exits, but not nested or shared between threads ({instead})",
                quoted_key(&self.key)
            ),
            Some(&self.key),
        )
    }
}

#[pymethods]
impl PyLockContext {
    #[new]
    /// `kind`: "lock", a side of the read-write lock, "read" or "write", or "semaphore"
    /// (`count` permits of a pool of `permits`).
    /// `shared`: made by `redlock()` or a sibling, which take the connection options too (named
    /// when an unknown option is refused).
    #[pyo3(signature = (manager, key, options = None, kind = "lock", permits = None, count = None, shared = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        manager: Bound<'_, PyManager>,
        key: &Bound<'_, PyAny>,
        options: Option<&Bound<'_, PyDict>>,
        kind: &str,
        permits: Option<&Bound<'_, PyAny>>,
        count: Option<&Bound<'_, PyAny>>,
        shared: bool,
    ) -> PyResult<Self> {
        let named = match kind {
            "semaphore" => "semaphore name",
            _ => "lock key",
        };
        let key = key_str(py, key, named)?;
        let kind = lock_kind(py, &key, kind, permits, count)?;
        let held = Held::of(kind);
        let what = match kind {
            host::Kind::Permits { .. } => "semaphore",
            _ => "lock",
        };
        let mut also = match kind {
            host::Kind::Permits { .. } => vec!["permits", "count"],
            _ => Vec::new(),
        };
        if shared {
            also.extend(crate::options::manager_options());
        }
        let args = manager.get().args(py, &key, what, options, &also)?;
        let opts = kind.options(args.opts);
        // Refused here, where the context is made, rather than at its `with` (a semaphore's
        // counts, a lease the watchdog cannot keep).
        ferrolock::check_request(&key, &opts).map_err(|e| to_py(py, &e, Some(&key)))?;
        Ok(PyLockContext {
            manager: manager.unbind(),
            key,
            held,
            opts,
            interrupt: args.interrupt,
            shared: Arc::default(),
        })
    }

    #[getter]
    fn key(&self) -> &str {
        &self.key
    }

    /// Whether a lock lost inside the block interrupts the body (see the README).
    #[getter]
    fn interrupt(&self) -> bool {
        self.interrupt
    }

    /// Entered by `with` (its acquire may still be waiting): `async with` refuses to enter too.
    #[getter]
    fn _entered(&self) -> bool {
        self.shared.state().entered
    }

    /// Raises the error of a context entered again while it is entered (`async with` too).
    fn _in_use(&self, py: Python<'_>) -> PyResult<()> {
        Err(self.in_use(py))
    }

    /// The held lock while inside the block, else None.
    #[getter]
    fn lock(&self, py: Python<'_>) -> Option<Py<PyLock>> {
        self.shared.state().lock.as_ref().map(|l| l.clone_ref(py))
    }

    fn __enter__(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<PyLock>> {
        let this = slf.get();
        // Entered by `async with` (the Python half's `_ause`) counts as entered too.
        let entered_async = slf.getattr("_ause").map(|u| !u.is_none()).unwrap_or(false);
        this.enter(py, entered_async)
    }

    #[pyo3(signature = (_exc_type = None, exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        // Run by a signal handler inside this thread's extend() or release() of the block's
        // lock (an ExitStack closed there), the release would wait for that call for ever:
        // refused before the block is left, so that its own exit still releases.
        let held = self.shared.state().lock.as_ref().map(|l| l.clone_ref(py));
        if let Some(held) = held {
            crate::lock::refuse_inside_call(py, &held.get().lock, "__exit__")?;
        }
        // First, before anything can run bytecode: leave the body and revoke an injection
        // that has not fired yet.
        forget_block(&Arc::downgrade(&self.shared));
        let lock = {
            let mut st = self.shared.state();
            if st.injected {
                // SAFETY: GIL held; NULL clears the thread's pending async exception.
                unsafe {
                    pyo3::ffi::PyThreadState_SetAsyncExc(st.thread as c_long, std::ptr::null_mut())
                };
                injected_losses().retain(|(t, _, _)| *t != st.thread);
            }
            st.in_body = false;
            st.entered = false;
            st.generation += 1;
            st.injected = false;
            st.lock.take()
        };
        let Some(lock) = lock else {
            return Ok(false);
        };
        let lock = lock.bind(py).get().lock.clone();
        let exc = exc.filter(|e| !e.is_none());
        let body = match exc {
            None => Body::Finished,
            Some(e) if e.is_instance(&injected_class(py)?)? => Body::StoppedByLoss,
            Some(e) => body_of(e),
        };
        let end = bridge::detached(py, || host::scope::end_blocking(&lock, body));
        scope_end(py, end, exc, &self.key)
    }

    /// The end of an `async with` (`__aexit__`), awaited: the same decision and messages as
    /// `__exit__` (`host::scope`). `stopped` says the body's `exc` is the cancellation this
    /// context made on loss. Cancelling the await does not cancel the release.
    #[pyo3(signature = (lock, stopped, exc = None))]
    fn _end_async<'py>(
        &self,
        py: Python<'py>,
        lock: &Bound<'py, PyLock>,
        stopped: bool,
        exc: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let exc = exc.filter(|e| !e.is_none());
        let body = match &exc {
            None => Body::Finished,
            Some(_) if stopped => Body::StoppedByLoss,
            Some(e) => body_of(e),
        };
        let lock = lock.get().lock.clone();
        let key = self.key.clone();
        let exc = exc.map(Bound::unbind);
        bridge::spawn_coroutine(
            py,
            async move { host::scope::end(&lock, body).await },
            false,
            move |py, end| {
                let exc = exc.as_ref().map(|e| e.bind(py));
                scope_end(py, end, exc, &key).map(|b| {
                    pyo3::types::PyBool::new(py, b)
                        .to_owned()
                        .into_any()
                        .unbind()
                })
            },
        )
    }

    /// A coroutine acquiring this context's lock for `owner` (used by `__aenter__`).
    fn _acquire_async<'py>(&self, py: Python<'py>, owner: u64) -> PyResult<Bound<'py, PyAny>> {
        refuse_awaiting_an_enclosing_block(py, self.manager.get(), &self.key, self.held)?;
        self.manager
            .get()
            .acquire_future(py, self.key.clone(), self.opts.clone(), owner)
    }

    /// `__aenter__` got `lock` for the task `owner` (None: `__aexit__` leaves the body):
    /// recorded so that a blocking acquire of the key on this event loop's thread is refused.
    fn _async_body(&self, lock: Option<Py<PyLock>>, owner: u64) {
        forget_block(&Arc::downgrade(&self.shared));
        let entering = lock.is_some();
        let old = std::mem::replace(&mut self.shared.state().async_lock, lock);
        drop(old);
        if entering {
            self.record_block(owner, true);
        }
    }

    fn __repr__(&self) -> String {
        // The kind too: a read, write or semaphore context read as a lock's.
        let (word, pool) = described_held(self.held);
        format!("<ferrolock.LockContext {word} key={:?}{pool}>", self.key)
    }
}

/// How a body that raised `exc` ended: an `Exception` failed it; anything else
/// (`KeyboardInterrupt`, `SystemExit`, a cancellation) interrupted it and goes through.
pub fn body_of(exc: &Bound<'_, PyAny>) -> Body {
    if exc.is_instance_of::<pyo3::exceptions::PyException>() {
        Body::Failed
    } else {
        Body::Interrupted
    }
}

/// Carries out `host::scope`'s decision for `with` and `async with` alike: `Ok(false)` lets
/// the body's outcome stand (after logging, if so decided); `Err` is the exception to raise,
/// caused by the body's `exc` when the decision chains it, else shown without a cause.
pub fn scope_end(
    py: Python<'_>,
    end: ScopeEnd,
    exc: Option<&Bound<'_, PyAny>>,
    key: &str,
) -> PyResult<bool> {
    match end {
        ScopeEnd::Clean => Ok(false),
        ScopeEnd::Log(message) => {
            // A signal that came during the release (which does not stop for one) has its
            // handler run here, not in the logging call's Python code, whose error is dropped:
            // Ctrl-C was lost there, and only the body's exception went on.
            let signalled = py.check_signals();
            crate::log::python_log(py, 30, &message);
            signalled.map(|()| false)
        }
        ScopeEnd::Raise { error, chain } => {
            let err = to_py(py, &error, Some(key));
            match exc.filter(|_| chain) {
                Some(cause) => err.set_cause(py, Some(PyErr::from_value(cause.clone()))),
                None => {
                    // `raise ... from None`.
                    let value = err.value(py);
                    value.setattr("__cause__", py.None())?;
                    value.setattr("__suppress_context__", true)?;
                }
            }
            Err(err)
        }
    }
}
