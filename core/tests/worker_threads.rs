//! `FERROLOCK_WORKER_THREADS`: a value that is refused is named once in a warning, and the
//! process runtime runs one worker. One test: the runtime and the log sink are per process,
//! and this file is a process of its own.

use std::sync::{Arc, Mutex};

use ferrolock::host::log::{self, LogLevel, LogRecord};

#[test]
fn a_refused_worker_count_is_named_once_even_by_a_sink_that_needs_the_runtime() {
    // SAFETY: set before anything in this process reads the environment or starts a thread
    // that does (the runtime is built below).
    unsafe { std::env::set_var("FERROLOCK_WORKER_THREADS", "lots") };
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = {
        let seen = seen.clone();
        // As Python's sink does: hands the record to the runtime's blocking pool, so it
        // needs the runtime while the runtime is being built.
        Box::new(move |r: &LogRecord<'_>| {
            let message = r.message.to_string();
            let seen = seen.clone();
            drop(
                ferrolock::runtime::handle()
                    .spawn_blocking(move || seen.lock().unwrap().push(message)),
            );
        })
    };
    log::set_sink(Some(sink), LogLevel::Warn).unwrap();

    let rt = ferrolock::runtime::runtime();
    assert_eq!(rt.metrics().num_workers(), 1);
    // The record reaches `seen` through the blocking pool: wait for it, then for a second
    // one, which would have come in the same way by then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while seen.lock().unwrap().is_empty() {
        assert!(std::time::Instant::now() < deadline, "no warning");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    rt.block_on(async {
        rt.spawn_blocking(|| ()).await.unwrap();
    });
    let seen = seen.lock().unwrap().clone();
    let about: Vec<_> = seen
        .iter()
        .filter(|m| m.contains("FERROLOCK_WORKER_THREADS"))
        .collect();
    assert_eq!(about.len(), 1, "{seen:?}");
    assert!(about[0].contains("\"lots\""), "{}", about[0]);
    assert!(about[0].contains("one worker thread"), "{}", about[0]);
}
