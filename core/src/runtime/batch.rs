//! Calls handed to the process runtime by threads outside it (a Node binding's promises),
//! polled together in one task instead of a task each.
//!
//! Why: a connection's requests go out from redis-rs's connection task, and tokio runs a task
//! woken by the one it is polling right after it (its "LIFO slot"). With a task per call, the
//! connection task ran after every call and wrote each request in a system call of its own,
//! one `writev` per request at 16 concurrent Node locks on one node (`perf stat`), and the
//! Redis server read each on its own too. Polled together, the calls that arrived at once
//! queue their requests first and the connection writes them in one.
//!
//! But one write for all of them holds the first request back until the last call is
//! polled, and the calls then move through the caller, the runtime and the server in one
//! convoy, each stage idle while another works: 16 concurrent locks on one node went from
//! 45k to 46k locks/s with a fifth less CPU per lock (21 to 17 µs). So the batch lets the
//! connections write after every `CHUNK` new calls: the server starts on those while the next
//! are polled (49-57k; chunks of 2 and of 6-8 measured lower; docs/decisions/).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};

use futures::FutureExt;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, error::SendError, unbounded_channel};

/// New calls polled before the connections get to write their requests.
const CHUNK: usize = 4;

type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The queue into one task of the process runtime that polls every call handed to it.
pub struct CallBatch {
    /// The task's queue, and the process it was made in (a forked child's runtime is a new
    /// one, and the parent's task does not run there).
    queue: Mutex<Option<(u32, UnboundedSender<Call>)>>,
}

impl Default for CallBatch {
    fn default() -> Self {
        Self::new()
    }
}

impl CallBatch {
    pub const fn new() -> CallBatch {
        CallBatch {
            queue: Mutex::new(None),
        }
    }

    /// Runs `call` on the process runtime, polled with the other calls of this batch. A
    /// panic in `call` ends that call only (the caller catches it first if it has an answer
    /// to give: the panic hook has reported it either way).
    pub fn run(&self, call: impl Future<Output = ()> + Send + 'static) {
        let mut call: Call = Box::pin(call);
        let pid = super::pid();
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_in, sender)) = queue.as_ref()
            && *made_in == pid
        {
            match sender.send(call) {
                Ok(()) => return,
                Err(SendError(back)) => call = back,
            }
        }
        // First call, or the task is gone (a forked child; or its runtime stopped): a new one.
        let (sender, calls) = unbounded_channel();
        let _ = sender.send(call);
        super::runtime().spawn(drive(calls));
        *queue = Some((pid, sender));
    }
}

/// Polls every call received until the queue's sender is dropped and the calls are done.
async fn drive(mut calls: UnboundedReceiver<Call>) {
    let mut running = FuturesUnordered::new();
    let mut open = true;
    std::future::poll_fn(|cx| poll_calls(cx, &mut calls, &mut running, &mut open)).await
}

fn poll_calls(
    cx: &mut Context<'_>,
    calls: &mut UnboundedReceiver<Call>,
    running: &mut FuturesUnordered<futures::future::CatchUnwind<AssertUnwindSafe<Call>>>,
    open: &mut bool,
) -> Poll<()> {
    loop {
        let mut taken = 0;
        while *open {
            if taken == CHUNK {
                // Poll the new calls so that they queue their requests, then yield: a
                // connection task they woke runs before this task comes round again.
                while let Poll::Ready(Some(_)) = running.poll_next_unpin(cx) {}
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            match calls.poll_recv(cx) {
                Poll::Ready(Some(call)) => {
                    running.push(AssertUnwindSafe(call).catch_unwind());
                    taken += 1;
                }
                Poll::Ready(None) => *open = false,
                Poll::Pending => break,
            }
        }
        match running.poll_next_unpin(cx) {
            // One call ended (or panicked); others may be ready, and new calls may be queued.
            Poll::Ready(Some(_)) => {}
            Poll::Ready(None) if !*open => return Poll::Ready(()),
            Poll::Ready(None) | Poll::Pending => return Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    /// Waits (at most 30 s: only a broken batch takes that long) for `count` to reach `n`.
    fn wait_for(count: &AtomicUsize, n: usize) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while count.load(Ordering::SeqCst) < n {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {n} calls ended",
                count.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn calls_handed_in_at_once_all_end_and_a_panic_ends_only_its_own() {
        static BATCH: CallBatch = CallBatch::new();
        let ended = Arc::new(AtomicUsize::new(0));
        for i in 0..50 {
            let ended = ended.clone();
            BATCH.run(async move {
                // Some end at once, some after a sleep on the runtime's timer.
                if i % 2 == 0 {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                if i == 7 {
                    panic!("call {i} panics on purpose");
                }
                ended.fetch_add(1, Ordering::SeqCst);
            });
        }
        wait_for(&ended, 49);
        // The batch's task survived the panic: a later call still runs.
        let after = ended.clone();
        BATCH.run(async move {
            after.fetch_add(1, Ordering::SeqCst);
        });
        wait_for(&ended, 50);
    }

    /// On the process runtime's one worker (tests never set `FERROLOCK_WORKER_THREADS`; with a
    /// second worker the woken task could run beside the batch instead of after it).
    #[test]
    fn a_task_that_a_call_wakes_runs_after_each_chunk_not_after_the_whole_batch() {
        static BATCH: CallBatch = CallBatch::new();
        const CALLS: usize = 10;
        let polled = Arc::new(AtomicUsize::new(0));
        let (woke, mut wakes) = tokio::sync::mpsc::unbounded_channel::<()>();
        let seen = Arc::new(Mutex::new(Vec::new()));
        // Stands for a connection's task: woken by every call, it records how many calls had
        // been polled each time it ran.
        let observer = {
            let (polled, seen) = (polled.clone(), seen.clone());
            super::super::runtime().spawn(async move {
                while wakes.recv().await.is_some() {
                    while wakes.try_recv().is_ok() {}
                    let n = polled.load(Ordering::SeqCst);
                    seen.lock().unwrap().push(n);
                    if n == CALLS {
                        return;
                    }
                }
            })
        };
        // Queued while the batch's task cannot run: the runtime's worker is held up by a
        // task that waits for all of them to be queued.
        let (queued, go) = std::sync::mpsc::channel::<()>();
        let holder = super::super::runtime().spawn(async move {
            let _ = go.recv_timeout(Duration::from_secs(30));
        });
        for _ in 0..CALLS {
            let (polled, woke) = (polled.clone(), woke.clone());
            BATCH.run(async move {
                polled.fetch_add(1, Ordering::SeqCst);
                let _ = woke.send(());
                std::future::pending::<()>().await;
            });
        }
        queued.send(()).unwrap();
        drop(holder);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !observer.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "seen {:?}",
                seen.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let seen = seen.lock().unwrap().clone();
        assert_eq!(
            seen.first(),
            Some(&CHUNK),
            "runs of the woken task: {seen:?}"
        );
        assert_eq!(
            seen.last(),
            Some(&CALLS),
            "runs of the woken task: {seen:?}"
        );
        assert!(
            seen.len() >= CALLS.div_ceil(CHUNK),
            "runs of the woken task: {seen:?}"
        );
    }
}
