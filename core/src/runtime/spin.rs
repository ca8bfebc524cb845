//! Reply polling for blocking callers (see DESIGN.md, "Blocking callers").
//!
//! A thread blocked in `runtime::block_on` with a request in flight polls for the reply for
//! a short window before it sleeps in `epoll_wait`. On a virtual machine a sleeping CPU is
//! halted, and waking it for the reply costs more than a local round trip (an interrupt through
//! the hypervisor; figures in docs/decisions/). This is what the kernel's `haltpoll` idle driver and the spinning
//! phase of adaptive mutexes do, for the same reason.
//!
//! The polling yields the CPU on every turn but the first (`sched_yield`), so a Redis server
//! or anything else runnable on the same CPU runs first, and it stops by itself where it does not pay: a
//! thread whose replies came after the window `MISSES` times in a row (a remote server, whose
//! round trip is longer) sends the next `REST` requests without polling, then tries again,
//! so polling costs it about `MISSES` windows every `MISSES + REST` requests.
//!
//! A yield that comes back after more than the window means another task on this CPU ran
//! for a whole time slice (a CPU-bound process sharing it): the kernel runs a thread that
//! yielded only once that task's slice is over, and never preempts it for a thread that is
//! merely runnable, as it does for one woken by its reply. Polling then costs a slice (about
//! 3 ms) per request instead of saving a wake-up, so the thread stops at once and rests,
//! twice as long each time it meets that again (up to `MAX_REST` requests), until a polled
//! reply comes within the window.
//! Async callers on the runtime's own threads (asyncio through the binding, tokio) never poll.
//! A call that another thread awaits (a Node promise, `AwaitedCalls`) has the runtime's worker
//! poll the same way, by the same rules, while it is the only one in flight and for a window
//! after it settled, when the caller's next call usually comes: with more calls in flight the
//! worker has their replies to handle, and polling would only take a CPU they need.
//! `FERROLOCK_SPIN_US=0` turns polling off; another value sets the window (µs, at most 1000).

use std::cell::Cell;
use std::future::Future;
use std::pin::pin;
use std::sync::OnceLock;
use std::task::Poll;
use std::time::{Duration, Instant};

/// How long to poll for a reply, unless `FERROLOCK_SPIN_US` says otherwise: about twice a
/// local round trip on a polling client, far shorter than a remote one.
const WINDOW_DEFAULT: Duration = Duration::from_micros(100);
/// `FERROLOCK_SPIN_US` is capped at this: a longer window only burns CPU.
const MAX_WINDOW_US: u64 = 1_000;
/// After this many replies in a row that came too late to be polled for...
const MISSES: u32 = 8;
/// ...a thread sends this many requests without polling, then tries again.
const REST: u32 = 64;
/// The longest rest after yields that overran the window (see the module's doc).
const MAX_REST: u32 = 4096;

thread_local! {
    static STATE: Cell<State> = const { Cell::new(State::new()) };
}

/// One thread's polling: its requests in flight and how its recent replies came.
#[derive(Clone, Copy, Debug, PartialEq)]
struct State {
    /// Requests in flight on this thread's runtime.
    in_flight: u32,
    /// When the oldest of them was sent.
    since: Option<Instant>,
    /// Replies in a row that came after the window (the thread had gone to sleep).
    misses: u32,
    /// Requests left to send without polling, after `MISSES` misses in a row.
    resting: u32,
    /// Polling turns since the oldest request in flight was sent.
    turns: u32,
    /// The rest after the next yield that overruns the window: doubled by each one, back to
    /// `REST` once a polled reply comes within the window.
    overrun_rest: u32,
    /// When the last request in flight settled (`AwaitedCalls` polls for a window after it).
    idle_since: Option<Instant>,
}

impl State {
    const fn new() -> State {
        State {
            in_flight: 0,
            since: None,
            misses: 0,
            resting: 0,
            turns: 0,
            overrun_rest: REST,
            idle_since: None,
        }
    }

    fn sent(&mut self, now: Instant) {
        if self.in_flight == 0 {
            self.since = Some(now);
            self.turns = 0;
        }
        self.in_flight += 1;
    }

    /// A request settled (answered, failed or dropped) at `now`.
    fn settled(&mut self, now: Instant, window: Duration) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if self.in_flight > 0 {
            return;
        }
        self.idle_since = Some(now);
        let took = self.since.take().map_or(Duration::MAX, |t| now - t);
        if self.resting > 0 {
            self.resting -= 1;
        } else if took <= window {
            self.misses = 0;
            self.overrun_rest = REST;
        } else {
            self.misses += 1;
            if self.misses >= MISSES {
                self.misses = 0;
                self.resting = REST;
            }
        }
    }

    /// Counts a polling turn; true for every turn but the first since the oldest request in
    /// flight was sent (that one lets the runtime write the request first).
    fn turn(&mut self) -> bool {
        self.turns += 1;
        self.turns > 1
    }

    /// A yield came back after `took`: past the window, another task had this CPU for a time
    /// slice, and polling on would cost one per request. Stop now, and rest.
    fn yielded(&mut self, took: Duration, window: Duration) {
        if took <= window || self.resting > 0 {
            return;
        }
        self.misses = 0;
        self.resting = self.overrun_rest;
        self.overrun_rest = (self.overrun_rest * 2).min(MAX_REST);
    }

    fn poll_now(&self, now: Instant, window: Duration) -> bool {
        self.in_flight > 0 && self.resting == 0 && self.since.is_some_and(|t| now - t < window)
    }

    /// For a call another thread awaits: poll while it is the only one in flight and within
    /// its window, or, with none in flight, within the window after the last one settled.
    fn poll_awaited_now(&self, now: Instant, window: Duration) -> bool {
        match self.in_flight {
            0 => self.resting == 0 && self.idle_since.is_some_and(|t| now - t < window),
            1 => self.poll_now(now, window),
            _ => false,
        }
    }
}

fn window() -> Duration {
    #[cfg(test)]
    if let Some(w) = tests::WINDOW.with(Cell::get) {
        return w;
    }
    static WINDOW: OnceLock<Duration> = OnceLock::new();
    *WINDOW.get_or_init(|| parse_window(std::env::var("FERROLOCK_SPIN_US").ok()))
}

/// The window `FERROLOCK_SPIN_US` asks for (unset: the default).
fn parse_window(value: Option<String>) -> Duration {
    let Some(value) = value else {
        return WINDOW_DEFAULT;
    };
    match value.trim().parse::<u64>() {
        Ok(us) if us > MAX_WINDOW_US => {
            tracing::warn!(
                "FERROLOCK_SPIN_US={value:?} is above the most, {MAX_WINDOW_US} µs (a longer \
                 window only burns CPU); polling for {MAX_WINDOW_US} µs"
            );
            Duration::from_micros(MAX_WINDOW_US)
        }
        Ok(us) => Duration::from_micros(us),
        Err(_) => {
            tracing::warn!(
                "FERROLOCK_SPIN_US={value:?} is not a whole number of microseconds; \
                 polling for {WINDOW_DEFAULT:?}"
            );
            WINDOW_DEFAULT
        }
    }
}

thread_local! {
    /// Requests this thread sent with polling on (the test hook below).
    static POLLED: Cell<u64> = const { Cell::new(0) };
}

/// Test hook: how many requests the calling thread has sent with reply polling on. Blocking
/// callers count theirs; async callers and `FERROLOCK_SPIN_US=0` never do. (How many of them
/// were answered while the thread polled depends on the machine: `make bench` reports it.)
#[doc(hidden)]
pub fn __polled_requests() -> u64 {
    POLLED.try_with(Cell::get).unwrap_or(0)
}

/// Runs `f` on this thread's state; `None` while the thread is being torn down.
fn update<R>(f: impl FnOnce(&mut State) -> R) -> Option<R> {
    STATE
        .try_with(|s| {
            let mut st = s.get();
            let out = f(&mut st);
            s.set(st);
            out
        })
        .ok()
}

/// A request in flight on a blocking caller's thread: from its send to its reply (or until
/// it is dropped). Inert on other threads.
pub(crate) struct Awaiting {
    active: bool,
}

impl Awaiting {
    /// Call as a request is sent.
    pub(crate) fn start() -> Awaiting {
        if !super::driving_locally() || window().is_zero() {
            return Awaiting { active: false };
        }
        update(|st| st.sent(Instant::now()));
        let _ = POLLED.try_with(|n| n.set(n.get() + 1));
        Awaiting { active: true }
    }
}

impl Drop for Awaiting {
    fn drop(&mut self) {
        if self.active {
            update(|st| st.settled(Instant::now(), window()));
        }
    }
}

/// Whether the thread should poll rather than sleep now: a request is in flight and its
/// window has not run out.
fn poll_now() -> bool {
    update(|st| st.poll_now(Instant::now(), window())).unwrap_or(false)
}

/// Counts a polling turn, and whether it should give the CPU away first.
fn yield_cpu_now() -> bool {
    update(State::turn).unwrap_or(true)
}

/// Drives `future` on a blocking caller's runtime, polling for replies as described above
/// instead of sleeping while `poll_now` says so.
pub(crate) async fn polling<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    loop {
        let step = std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Some(out)),
            Poll::Pending if poll_now() => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        })
        .await;
        if let Some(out) = step {
            return out;
        }
        // Have the runtime look for I/O without sleeping (tokio polls its driver with a zero
        // timeout before it resumes a yielded task). The first turn after a send also lets the
        // runtime's connection task write the request; on later turns whatever else is
        // runnable on this CPU (a Redis server) goes first.
        if yield_cpu_now() {
            let before = Instant::now();
            std::thread::yield_now();
            let took = before.elapsed();
            update(|st| st.yielded(took, window()));
        }
        tokio::task::yield_now().await;
    }
}

/// The calls that threads outside the runtime await (a Node binding's promises), and the
/// runtime worker's polling for them (see the module's doc). `started` as a call is made,
/// `settled` as its outcome is handed over; `started` says when to spawn `stay_awake`.
pub struct AwaitedCalls {
    state: std::sync::Mutex<State>,
    /// A `stay_awake` task is running (one at a time is enough).
    awake: std::sync::atomic::AtomicBool,
}

impl Default for AwaitedCalls {
    fn default() -> Self {
        Self::new()
    }
}

impl AwaitedCalls {
    pub const fn new() -> AwaitedCalls {
        AwaitedCalls {
            state: std::sync::Mutex::new(State::new()),
            awake: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn poll_now(&self) -> bool {
        let window = window();
        self.with(|st| st.poll_awaited_now(Instant::now(), window))
    }

    /// A call is made. True when the caller should spawn [`AwaitedCalls::stay_awake`] on the
    /// runtime: polling is on, the call may be polled for, and no such task runs.
    pub fn started(&self) -> bool {
        if window().is_zero() {
            return false;
        }
        let now = Instant::now();
        let window = window();
        let poll = self.with(|st| {
            st.sent(now);
            st.poll_awaited_now(now, window)
        });
        poll && !self.awake.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// A call's outcome was handed to its caller.
    pub fn settled(&self) {
        if window().is_zero() {
            return;
        }
        let window = window();
        self.with(|st| st.settled(Instant::now(), window));
    }

    /// Keeps the runtime worker polling (it looks for I/O between turns without sleeping)
    /// while [`AwaitedCalls`]'s rule says so, yielding its CPU on every turn.
    pub async fn stay_awake(&self) {
        use std::sync::atomic::Ordering;
        loop {
            while self.poll_now() {
                let before = Instant::now();
                std::thread::yield_now();
                let took = before.elapsed();
                let window = window();
                self.with(|st| st.yielded(took, window));
                tokio::task::yield_now().await;
            }
            self.awake.store(false, Ordering::Release);
            // A call started between the last check and the store saw a task still awake and
            // spawned none: check again, and go on if it may be polled for.
            if !self.poll_now() || self.awake.swap(true, Ordering::AcqRel) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Duration = Duration::from_micros(100);

    thread_local! {
        /// Overrides `window()` on this test's thread: the glue tests below must not depend on
        /// how fast this machine runs them.
        pub(super) static WINDOW: Cell<Option<Duration>> = const { Cell::new(None) };
    }

    /// One request sent at `t0`, answered `after` later; returns the time of the answer.
    fn request(st: &mut State, t0: Instant, after: Duration) -> Instant {
        st.sent(t0);
        st.settled(t0 + after, W);
        t0 + after
    }

    #[test]
    fn polls_while_a_request_is_in_flight_and_its_window_lasts() {
        let mut st = State::new();
        let t0 = Instant::now();
        assert!(!st.poll_now(t0, W), "nothing in flight");
        st.sent(t0);
        assert!(st.poll_now(t0 + Duration::from_micros(99), W));
        assert!(!st.poll_now(t0 + W, W), "window over");
        // A second request in flight does not restart the window: it counts from the oldest.
        st.sent(t0 + Duration::from_micros(50));
        assert!(!st.poll_now(t0 + Duration::from_micros(120), W));
        st.settled(t0 + Duration::from_micros(130), W);
        assert_eq!(st.in_flight, 1);
        st.settled(t0 + Duration::from_micros(140), W);
        assert!(!st.poll_now(t0 + Duration::from_micros(141), W));
        assert_eq!(st.misses, 1, "the pair took 140 µs: one late reply");
    }

    #[test]
    fn late_replies_in_a_row_stop_polling_for_a_while_then_it_tries_again() {
        let mut st = State::new();
        let mut t = Instant::now();
        let late = Duration::from_millis(2);
        for _ in 0..MISSES - 1 {
            t = request(&mut st, t, late);
        }
        // One reply in time resets the count: occasional late replies never stop polling.
        t = request(&mut st, t, Duration::from_micros(40));
        assert_eq!(st.misses, 0);
        for _ in 0..MISSES {
            t = request(&mut st, t, late);
        }
        assert_eq!(st.resting, REST, "{MISSES} late replies in a row");
        for i in 0..REST {
            st.sent(t);
            assert!(!st.poll_now(t, W), "polled while resting, request {i}");
            st.settled(t + late, W);
            t += late;
        }
        st.sent(t);
        assert!(st.poll_now(t, W), "polling again after {REST} requests");
    }

    #[test]
    fn a_yield_that_overran_the_window_stops_polling_and_rests_longer_each_time() {
        let mut st = State::new();
        let mut t = Instant::now();
        let short = Duration::from_micros(30);
        // A yield within the window (Redis ran its request) changes nothing.
        st.sent(t);
        st.yielded(short, W);
        assert!(st.poll_now(t, W));
        st.settled(t + short, W);
        let mut rests = Vec::new();
        for _ in 0..8 {
            t += Duration::from_millis(1);
            st.sent(t);
            assert!(st.poll_now(t, W), "polling again after the rest");
            // A CPU-bound task had the CPU for a slice: polling stops for this request too.
            st.yielded(Duration::from_millis(3), W);
            assert!(!st.poll_now(t, W), "still polling after an overrun");
            st.settled(t + Duration::from_millis(3), W);
            let rest = st.resting;
            rests.push(rest);
            for _ in 0..rest {
                t += Duration::from_millis(1);
                st.sent(t);
                assert!(!st.poll_now(t, W), "polled while resting");
                st.settled(t + short, W);
            }
        }
        // The rest on the overrunning request itself was spent by its own settle.
        let want: Vec<u32> = (0..8).map(|i| (REST << i).min(MAX_REST) - 1).collect();
        assert_eq!(rests, want);
        // One polled reply within the window: the next overrun rests `REST` again.
        st.sent(t);
        st.settled(t + short, W);
        st.sent(t);
        st.yielded(Duration::from_millis(3), W);
        assert_eq!(st.resting, REST);
    }

    #[test]
    fn the_first_turn_after_a_send_does_not_yield_the_cpu_later_ones_do() {
        let mut st = State::new();
        let t0 = Instant::now();
        st.sent(t0);
        assert!(!st.turn(), "first turn: the runtime writes the request");
        assert!(st.turn() && st.turn());
        // A second request while one is in flight does not restart the count...
        st.sent(t0);
        assert!(st.turn());
        // ...a send once nothing is in flight does.
        st.settled(t0, W);
        st.settled(t0, W);
        st.sent(t0);
        assert!(!st.turn());
    }

    #[test]
    fn the_window_comes_from_ferrolock_spin_us() {
        assert_eq!(parse_window(None), WINDOW_DEFAULT);
        assert_eq!(parse_window(Some("0".into())), Duration::ZERO, "off");
        assert_eq!(
            parse_window(Some(" 250 ".into())),
            Duration::from_micros(250)
        );
        assert_eq!(
            parse_window(Some("5000".into())),
            Duration::from_micros(MAX_WINDOW_US),
            "capped"
        );
        assert_eq!(parse_window(Some("fast".into())), WINDOW_DEFAULT);
    }

    /// A future that is ready after `pending` polls and never arranges a wake-up itself: only
    /// a caller that polls again without being woken (one that spins) gets it ready.
    struct NeverWakes {
        pending: u32,
        polls: u32,
    }

    impl Future for NeverWakes {
        type Output = u32;
        fn poll(mut self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> Poll<u32> {
            self.polls += 1;
            if self.polls > self.pending {
                Poll::Ready(self.polls)
            } else {
                Poll::Pending
            }
        }
    }

    struct CountWakes(std::sync::atomic::AtomicU32);

    impl std::task::Wake for CountWakes {
        fn wake(self: std::sync::Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Polls `polling(NeverWakes)` by hand, outside any runtime, `times` times at most: the
    /// wake-ups `polling` arranged itself (one per turn it spun instead of sleeping), and the
    /// output if it finished.
    fn drive(pending: u32, times: u32) -> (u32, Option<u32>) {
        let wakes = std::sync::Arc::new(CountWakes(Default::default()));
        let waker = std::task::Waker::from(wakes.clone());
        let mut cx = std::task::Context::from_waker(&waker);
        let mut fut = pin!(polling(NeverWakes { pending, polls: 0 }));
        let mut out = None;
        for _ in 0..times {
            if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
                out = Some(v);
                break;
            }
        }
        (wakes.0.load(std::sync::atomic::Ordering::SeqCst), out)
    }

    fn set_state(st: State) {
        STATE.with(|s| s.set(st));
    }

    #[test]
    fn polling_spins_while_a_request_is_in_flight_and_its_window_lasts() {
        // A window no machine outlasts: the test is about the glue, not the clock.
        WINDOW.with(|w| w.set(Some(Duration::from_secs(3600))));
        let mut st = State::new();
        st.sent(Instant::now());
        set_state(st);
        // Each turn the future is pending, `polling` wakes itself (a turn of the runtime
        // that looks for I/O without sleeping) instead of waiting for the I/O driver.
        let (wakes, out) = drive(5, 100);
        assert_eq!(out, Some(6), "the future was polled until ready");
        assert_eq!(wakes, 5, "one self-arranged wake-up per pending turn");
        assert_eq!(STATE.with(Cell::get).turns, 5);
        WINDOW.with(|w| w.set(None));
        set_state(State::new());
    }

    #[test]
    fn polling_sleeps_when_nothing_is_in_flight_or_the_window_is_over_or_resting() {
        WINDOW.with(|w| w.set(Some(Duration::from_secs(3600))));
        let t0 = Instant::now();
        let mut in_flight = State::new();
        in_flight.sent(t0);
        let mut resting = in_flight;
        resting.resting = 3;
        for (what, st) in [("nothing in flight", State::new()), ("resting", resting)] {
            set_state(st);
            let (wakes, out) = drive(5, 3);
            assert_eq!((wakes, out), (0, None), "{what}: it spun");
        }
        // The window over: a zero-length window has always run out.
        WINDOW.with(|w| w.set(Some(Duration::ZERO)));
        set_state(in_flight);
        assert_eq!(drive(5, 3), (0, None), "window over: it spun");
        WINDOW.with(|w| w.set(None));
        set_state(State::new());
    }

    #[test]
    fn an_awaited_call_is_polled_for_alone_and_for_a_window_after_it_settled() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut st = State::new();
        assert!(
            !st.poll_awaited_now(t0, W),
            "nothing in flight, nothing settled"
        );
        st.sent(t0);
        assert!(
            st.poll_awaited_now(t0 + us(99), W),
            "the only call, within its window"
        );
        st.sent(t0 + us(10));
        assert!(
            !st.poll_awaited_now(t0 + us(20), W),
            "two in flight: their replies keep the worker busy"
        );
        st.settled(t0 + us(30), W);
        st.settled(t0 + us(40), W);
        // The caller's next call usually comes soon after an outcome: poll for it a window long.
        assert!(st.poll_awaited_now(t0 + us(139), W));
        assert!(
            !st.poll_awaited_now(t0 + us(140), W),
            "the window after the settle is over"
        );
        st.resting = 1;
        assert!(!st.poll_awaited_now(t0 + us(41), W), "resting");
    }

    #[test]
    fn awaited_calls_run_one_awake_task_which_ends_with_the_window() {
        WINDOW.with(|w| w.set(Some(Duration::from_millis(20))));
        let calls = AwaitedCalls::new();
        assert!(calls.started(), "the first call spawns the awake task");
        assert!(!calls.started(), "one awake task at a time");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        calls.settled();
        calls.settled();
        // Ends by itself once the window after the last settle is over (20 ms: any machine).
        rt.block_on(calls.stay_awake());
        assert!(!calls.awake.load(std::sync::atomic::Ordering::Acquire));
        assert!(calls.started(), "a later call spawns it again");
        WINDOW.with(|w| w.set(Some(Duration::ZERO)));
        let off = AwaitedCalls::new();
        assert!(!off.started(), "FERROLOCK_SPIN_US=0: no awake task");
        WINDOW.with(|w| w.set(None));
    }
}
