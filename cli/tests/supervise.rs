//! `ferrolock run` as a supervisor (renewal, stopping the child on loss, its process group,
//! its death with ours, nesting, the environment) and `inspect` / `scan`, as real processes
//! against real redis-servers. Bounds are deadlines or failure limits, never speed claims.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferrolock_testbed::{Cluster, RedisCluster, RedisServer};

/// The scripted Redisson 4.7.0 client of the core's interop tests (tests/redisson).
#[path = "../../core/tests/common/redisson.rs"]
#[allow(dead_code)]
mod redisson;

const HANG: Duration = Duration::from_secs(30);

fn ferrolock() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrolock"));
    cmd.env_remove("FERROLOCK_NODES")
        .env_remove("FERROLOCK_HELD")
        .stdin(Stdio::null());
    at_default_signals(&mut cmd);
    cmd
}

/// Starts `cmd` with the signals these tests send at their default action, as from a
/// terminal's shell: ferrolock leaves a signal it was started with ignored alone (as `nohup`
/// asks), and a test run as a background job of a script inherits SIGINT and SIGQUIT ignored.
/// A test may ignore one again after this (`pre_exec` closures run in order).
fn at_default_signals(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [
                libc::SIGINT,
                libc::SIGQUIT,
                libc::SIGHUP,
                libc::SIGTERM,
                libc::SIGUSR1,
                libc::SIGUSR2,
            ] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
}

fn output(mut cmd: Command) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    // Read while it runs: an output larger than a pipe's buffer would stop it mid-write.
    let drain = |mut pipe: Box<dyn std::io::Read + Send>| {
        thread::spawn(move || {
            let mut bytes = Vec::new();
            pipe.read_to_end(&mut bytes).expect("read output");
            bytes
        })
    };
    let stdout = drain(Box::new(child.stdout.take().expect("stdout")));
    let stderr = drain(Box::new(child.stderr.take().expect("stderr")));
    let end = Instant::now() + HANG;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("ferrolock did not exit within {HANG:?}");
        }
        thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn wait(child: &mut Child) -> std::process::ExitStatus {
    let end = Instant::now() + HANG;
    loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            return s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("ferrolock did not exit within {HANG:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let end = Instant::now() + HANG;
    while !done() {
        assert!(Instant::now() < end, "{what} never happened");
        thread::sleep(Duration::from_millis(20));
    }
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferrolock-cli-")
        .tempdir()
        .expect("tempdir")
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Wall-clock nanoseconds, comparable with `date +%s%N` in a child.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn alive(pid: i32) -> bool {
    // A zombie still answers kill(0): look at its state too.
    let state = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // SAFETY: kill with signal 0 only checks existence.
    let exists = unsafe { libc::kill(pid, 0) } == 0;
    exists && !state.contains(") Z")
}

#[test]
fn renewal_keeps_a_short_lock_for_a_child_that_outlives_its_ttl() {
    let server = RedisServer::start();
    let dir = tmp();
    let done = dir.path().join("done");
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "--ttl",
        "3s",
        "renewed",
        "--",
    ])
    .args(["sh", "-c", &format!("sleep 10; touch {}", p(&done))]);
    let mut child = cmd.stderr(Stdio::piped()).spawn().expect("spawn");
    let start = Instant::now();
    let token: Option<String> = loop {
        let t: Option<String> = server.cmd(&["GET", "renewed"]);
        if t.is_some() || start.elapsed() > HANG {
            break t;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let token = token.expect("never acquired");
    // Past three ttls: the key stays, with the same token, only because it is renewed.
    while !done.exists() {
        let now: Option<String> = server.cmd(&["GET", "renewed"]);
        assert_eq!(
            now.as_deref(),
            Some(token.as_str()),
            "lost after {:?}",
            start.elapsed()
        );
        thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(wait(&mut child).code(), Some(0));
    assert!(
        server.cmd::<Option<String>>(&["GET", "renewed"]).is_none(),
        "not released"
    );
}

#[test]
fn a_lost_lock_stops_the_child_and_its_group_before_the_deadline_and_exits_70() {
    let cluster = Cluster::start(3);
    let dir = tmp();
    let (child_term, grand_term, started) = (
        dir.path().join("child"),
        dir.path().join("grandchild"),
        dir.path().join("started"),
    );
    // A grandchild started through `sh -c`, in the background, traps TERM too.
    let script = format!(
        "sh -c 'trap \"date +%s%N > {g}; exit 0\" TERM; while :; do sleep 0.05; done' &
         trap 'date +%s%N > {c}; wait; exit 0' TERM; touch {s}; while :; do sleep 0.05; done",
        g = p(&grand_term),
        c = p(&child_term),
        s = p(&started)
    );
    let nodes = cluster.urls().join(",");
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &nodes,
        "--ttl",
        "3s",
        "--restart-guard",
        "0",
    ])
    .args(["--grace", "20s", "lost-run", "--", "sh", "-c", &script]);
    let mut run = cmd.stderr(Stdio::piped()).spawn().expect("spawn");
    wait_for("the child started", || started.exists());
    // No renewal confirms once the majority is paused: the lock's deadline is at most a ttl
    // (3 s) from now.
    let paused_at = now_ns();
    cluster.servers[1].pause();
    cluster.servers[2].pause();
    let status = wait(&mut run);
    cluster.servers[1].resume();
    cluster.servers[2].resume();
    let mut err = String::new();
    use std::io::Read;
    run.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(70), "{err}");
    assert!(err.contains("lost"), "{err}");
    let deadline = paused_at + Duration::from_secs(3).as_nanos();
    for (who, file) in [("child", &child_term), ("grandchild", &grand_term)] {
        let at: u128 = fs::read_to_string(file)
            .unwrap_or_else(|_| panic!("the {who} never got SIGTERM: {err}"))
            .trim()
            .parse()
            .unwrap();
        assert!(
            at < deadline,
            "the {who} got SIGTERM {} ms after the deadline",
            (at - deadline) / 1_000_000
        );
    }
}

/// What `run --ttl 2s <extra> KEY -- <a child that ignores SIGTERM>` did once the key was
/// deleted under it (the watchdog's next renewal finds it missing): its exit, the time from the
/// deletion to its end, whether the child got SIGTERM first, and its stderr.
struct IgnoredSigterm {
    status: std::process::ExitStatus,
    took: Duration,
    termed: bool,
    stderr: String,
}

fn lose_under_a_child_that_ignores_sigterm(key: &str, extra: &[&str]) -> IgnoredSigterm {
    let server = RedisServer::start();
    let dir = tmp();
    let (term, started) = (dir.path().join("term"), dir.path().join("started"));
    let script = format!(
        "trap 'touch {t}' TERM; touch {s}; while :; do sleep 0.05; done",
        t = p(&term),
        s = p(&started)
    );
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url(), "--ttl", "2s"])
        .args(extra)
        .args([key, "--", "sh", "-c", &script]);
    let mut run = cmd.stderr(Stdio::piped()).spawn().expect("spawn");
    wait_for("the child started", || started.exists());
    let deleted = Instant::now();
    server.cmd::<i64>(&["DEL", key]);
    let status = wait(&mut run);
    let took = deleted.elapsed();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut stderr).unwrap();
    IgnoredSigterm {
        status,
        took,
        termed: term.exists(),
        stderr,
    }
}

/// The grace is measured from the key's deletion, which comes before the loss and so before
/// the SIGTERM: a bound that holds however late the child's shell runs its trap (measured from
/// the trap's own timestamp, it failed once under load at 1998 ms). With a 2 s ttl the loss is
/// found within about a renewal period (under 1 s), so killing at the SIGTERM would still end
/// well inside the 3 s grace.
#[test]
fn a_child_that_ignores_sigterm_is_killed_no_sooner_than_the_grace() {
    let r = lose_under_a_child_that_ignores_sigterm("ignores", &["--grace", "3s"]);
    assert_eq!(r.status.code(), Some(70), "{}", r.stderr);
    assert!(r.termed, "killed without a SIGTERM first: {}", r.stderr);
    assert!(
        r.took >= Duration::from_secs(3),
        "killed {:?} after its key was deleted, before the 3 s grace",
        r.took
    );
}

/// Without --grace, a child that ignores SIGTERM is killed when the lock's validity ends: past
/// it another holder may run. Before, it was killed 10 s after the SIGTERM, running on without
/// the lock for most of them. The validity ends at most a ttl (2 s) after the key's deletion;
/// the bound below is far above that and far below the old 10 s.
#[test]
fn without_grace_a_child_that_ignores_sigterm_is_killed_when_the_validity_ends() {
    let r = lose_under_a_child_that_ignores_sigterm("ignores-default", &[]);
    assert_eq!(r.status.code(), Some(70), "{}", r.stderr);
    assert!(r.termed, "killed without a SIGTERM first: {}", r.stderr);
    assert!(
        r.stderr.contains("when its validity ends"),
        "the message does not say when SIGKILL comes: {}",
        r.stderr
    );
    assert!(
        r.took < Duration::from_secs(8),
        "killed {:?} after its key was deleted: it ran on past the validity ({})",
        r.took,
        r.stderr
    );
}

#[test]
fn killing_ferrolock_takes_its_child_down() {
    let server = RedisServer::start();
    let dir = tmp();
    let pidfile = dir.path().join("pid");
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url(), "orphan", "--"])
        .args([
            "sh",
            "-c",
            &format!("echo $$ > {}; exec sleep 60", p(&pidfile)),
        ]);
    let mut run = cmd.spawn().expect("spawn");
    wait_for("the child wrote its pid", || {
        fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(alive(pid));
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    wait_for("the child died with ferrolock", || !alive(pid));
}

#[test]
fn sighup_is_forwarded_to_the_child() {
    let server = RedisServer::start();
    let dir = tmp();
    let (got, started) = (dir.path().join("got"), dir.path().join("started"));
    let script = format!(
        "trap 'echo HUP > {g}; exit 4' HUP; touch {s}; while :; do sleep 0.05; done",
        g = p(&got),
        s = p(&started)
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "hup",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let mut run = cmd.spawn().expect("spawn");
    wait_for("the child started", || started.exists());
    // SAFETY: our own unreaped child.
    unsafe { libc::kill(run.id() as i32, libc::SIGHUP) };
    assert_eq!(wait(&mut run).code(), Some(4));
    assert_eq!(fs::read_to_string(&got).unwrap().trim(), "HUP");
    assert!(server.cmd::<Option<String>>(&["GET", "hup"]).is_none());
}

/// SIGQUIT (a container's STOPSIGNAL for nginx), SIGUSR1 and SIGUSR2 (a log reopen) sent to
/// ferrolock: their default action ended it at once, SIGKILLed COMMAND (no graceful stop)
/// and left the lock held until its ttl.
#[test]
fn sigquit_and_sigusr_are_forwarded_to_the_child_and_the_lock_released() {
    let server = RedisServer::start();
    for (sig, name) in [
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGUSR2, "USR2"),
    ] {
        let dir = tmp();
        let (got, started) = (dir.path().join("got"), dir.path().join("started"));
        let script = format!(
            "trap 'echo {name} > {g}; exit 4' {name}; touch {s}; while :; do sleep 0.05; done",
            g = p(&got),
            s = p(&started)
        );
        let key = format!("fwd-{name}");
        let mut cmd = ferrolock();
        cmd.args([
            "run",
            "--nodes",
            &server.url(),
            &key,
            "--",
            "sh",
            "-c",
            &script,
        ]);
        let mut run = cmd.spawn().expect("spawn");
        wait_for("the child started", || started.exists());
        assert!(server.cmd::<Option<String>>(&["GET", &key]).is_some());
        // SAFETY: our own unreaped child.
        unsafe { libc::kill(run.id() as i32, sig) };
        let status = wait(&mut run);
        assert_eq!(
            status.code(),
            Some(4),
            "SIG{name}: ferrolock ended with {status:?}"
        );
        assert_eq!(fs::read_to_string(&got).unwrap().trim(), name);
        assert!(
            server.cmd::<Option<String>>(&["GET", &key]).is_none(),
            "SIG{name}: the lock was left held"
        );
    }
}

/// `nohup ferrolock run KEY -- job`: a signal ferrolock was started with ignored stays
/// ignored, by COMMAND too. Its handler replaced the ignore, COMMAND was exec'd with the
/// signal's default action, and the SIGHUP of a closing terminal was forwarded and killed the
/// job nohup was meant to keep.
#[test]
fn a_signal_ignored_at_start_stays_ignored_by_ferrolock_and_its_child() {
    use std::os::unix::process::CommandExt;
    let server = RedisServer::start();
    let dir = tmp();
    let (ign, started, go) = (
        dir.path().join("ign"),
        dir.path().join("started"),
        dir.path().join("go"),
    );
    let script = format!(
        "grep SigIgn /proc/$$/status > {i}; touch {s}; while [ ! -e {g} ]; do sleep 0.05; done",
        i = p(&ign),
        s = p(&started),
        g = p(&go)
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "nohup",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    // SAFETY: async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut run = cmd.spawn().expect("spawn");
    wait_for("the child started", || started.exists());
    let mask = fs::read_to_string(&ign).unwrap();
    let mask = u64::from_str_radix(mask.trim().trim_start_matches("SigIgn:").trim(), 16).unwrap();
    assert_ne!(
        mask & (1 << (libc::SIGHUP - 1)),
        0,
        "the child does not ignore SIGHUP (SigIgn {mask:x})"
    );
    // SAFETY: our own unreaped child.
    unsafe { libc::kill(run.id() as i32, libc::SIGHUP) };
    fs::write(&go, "").unwrap();
    assert_eq!(wait(&mut run).code(), Some(0));
    assert!(server.cmd::<Option<String>>(&["GET", "nohup"]).is_none());
}

#[test]
fn the_child_sees_fence_nodes_and_held_and_a_nested_run_on_the_same_key_is_refused() {
    let server = RedisServer::start();
    let url = server.url();
    // The same server written apart: a nested run there would wait for itself all the same.
    let spelled = format!("{}/0", url.replace("redis://", "REDIS://"));
    let loopback = url.replace("127.0.0.1", "localhost");
    assert_ne!(loopback, url, "the test bed's URL names 127.0.0.1");
    let exe = env!("CARGO_BIN_EXE_ferrolock");
    let script = format!(
        "echo \"key=$FERROLOCK_KEY fence=$FERROLOCK_FENCE nodes=$FERROLOCK_NODES\"; \
         printf 'held=%s\\n' \"$FERROLOCK_HELD\"; \
         {exe} run --nodes {url} --wait 0 other -- sh -c 'printf \"inner=%s\\n\" \"$FERROLOCK_HELD\"'; \
         {exe} run --nodes {url} outer -- true; echo nested=$?; \
         {exe} run --nodes {spelled} outer -- true; echo spelled=$?; \
         {exe} run --nodes {loopback} --wait 0 outer -- true; echo loopback=$?; \
         {exe} run --nodes {url}/3 --wait 0 outer -- true; echo other_db=$?"
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run", "--nodes", &url, "--fence", "outer", "--", "sh", "-c", &script,
    ]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text} {err}");
    assert!(
        text.contains(&format!("key=outer fence=1 nodes={url}")),
        "{text}"
    );
    assert!(text.contains(&format!("held={url}\touter\n")), "{text}");
    assert!(
        text.contains(&format!("inner={url}\touter\n{url}\tother\n")),
        "{text}"
    );
    assert!(text.contains("nested=64"), "{text}");
    assert!(text.contains("spelled=64"), "{text}");
    assert!(text.contains("loopback=64"), "{text}");
    // Another database holds other keys: the same name there is another lock.
    assert!(text.contains("other_db=0"), "{text}");
    assert!(err.contains("already held by an enclosing"), "{err}");
}

/// FERROLOCK_FENCE is the fence of the lock this run holds: a nested run that takes no fence
/// (a plain lock without --fence, a semaphore) must not hand its child the enclosing run's,
/// which it would send to storage as the token of another key's grant.
#[test]
fn a_nested_run_without_a_fence_does_not_pass_on_the_enclosing_runs_fence() {
    let server = RedisServer::start();
    let url = server.url();
    let exe = env!("CARGO_BIN_EXE_ferrolock");
    let show = "sh -c 'echo \"$FERROLOCK_KEY fence=${FERROLOCK_FENCE-unset}\"'";
    let script = format!(
        "{exe} run --nodes {url} inner -- {show}; \
         {exe} run --nodes {url} --semaphore sem --permits 1 -- {show}; \
         {exe} run --nodes {url} --fence fenced -- {show}"
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run", "--nodes", &url, "--fence", "outer", "--", "sh", "-c", &script,
    ]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text} {err}");
    assert!(text.contains("inner fence=unset\n"), "{text}");
    assert!(text.contains("sem fence=unset\n"), "{text}");
    // Its own grant's fence, from its own counter.
    assert!(text.contains("fenced fence=1\n"), "{text}");
}

/// A nested run on a semaphore is one more holder; one that would wait for its own
/// enclosing runs (they hold the name as a lock, or leave fewer permits than it asks for)
/// fails at once instead (without --wait it waited for ever).
#[test]
fn a_nested_semaphore_run_that_would_wait_for_its_enclosing_runs_is_refused() {
    let server = RedisServer::start();
    let url = server.url();
    let exe = env!("CARGO_BIN_EXE_ferrolock");
    // Each case: the enclosing runs' flags (outermost first; one name per case), the
    // innermost run's flags, its exit status and a part of its message.
    for (name, outer, inner, want, says) in [
        (
            "two",
            &["--semaphore two --permits 2"][..],
            "--semaphore two --permits 2",
            "0",
            "",
        ),
        (
            "all",
            &["--semaphore all --permits 2"],
            "--semaphore all --permits 2 --count 2",
            "64",
            "1 of its 2 permits",
        ),
        (
            "one",
            &["--semaphore one --permits 1"],
            "--semaphore one --permits 1",
            "64",
            "1 of its 1 permits",
        ),
        (
            "pair",
            &["--semaphore pair --permits 3 --count 2"],
            "--semaphore pair --permits 3 --count 2",
            "64",
            "2 of its 3 permits",
        ),
        (
            "deep",
            &[
                "--semaphore deep --permits 3",
                "--semaphore deep --permits 3",
            ],
            "--semaphore deep --permits 3 --count 2",
            "64",
            "2 of its 3 permits",
        ),
        (
            "last",
            &[
                "--semaphore last --permits 3",
                "--semaphore last --permits 3",
            ],
            "--semaphore last --permits 3",
            "0",
            "",
        ),
        (
            "lock",
            &["lock"],
            "--semaphore lock --permits 2",
            "64",
            "held as a lock",
        ),
    ] {
        // The innermost run reports its status; each enclosing one runs the next inside it.
        let mut script = format!("{exe} run --nodes {url} {inner} --wait 0 -- true; echo inner=$?");
        for flags in outer.iter().skip(1).rev() {
            script = format!(
                "{exe} run --nodes {url} {flags} -- sh -c '{}'",
                script.replace('\'', "'\\''")
            );
        }
        let mut cmd = ferrolock();
        cmd.args(["run", "--nodes", &url])
            .args(outer[0].split(' '))
            .args(["--", "sh", "-c", &script]);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{name}: {text} {err}");
        assert!(
            text.contains(&format!("inner={want}\n")),
            "{name}: {text} {err}"
        );
        if want == "64" {
            assert!(
                err.contains(says) && err.contains("wait for ourselves"),
                "{name}: {err}"
            );
        }
    }
}

#[test]
fn a_key_with_a_newline_or_a_tab_is_one_held_line() {
    let server = RedisServer::start();
    let url = server.url();
    let exe = env!("CARGO_BIN_EXE_ferrolock");
    for (outer, inner, code) in [
        ("a\nb".to_string(), "a\nb".to_string(), 64),
        ("a\tb\\".to_string(), "a\tb\\".to_string(), 64),
        (format!("x\n{url}\tb"), "b".to_string(), 0),
        ("a\\nb".to_string(), "a\nb".to_string(), 0),
    ] {
        let script = format!(
            "printf 'held=%s|' \"$FERROLOCK_HELD\"; \
             '{exe}' run --nodes {url} --wait 0 \"$INNER\" -- true; echo inner=$?"
        );
        let mut cmd = ferrolock();
        cmd.env("INNER", &inner)
            .args(["run", "--nodes", &url, &outer, "--", "sh", "-c", &script]);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{outer:?}: {text} {err}");
        assert!(
            text.contains(&format!("inner={code}")),
            "{outer:?} / {inner:?}: {text} {err}"
        );
        // One line, the key written escaped.
        let held = text.split('|').next().unwrap_or_default();
        assert_eq!(held.lines().count(), 1, "{held:?}");
        assert!(
            !held.contains('\t') || held.matches('\t').count() == 1,
            "{held:?}"
        );
    }
}

#[test]
fn new_flags_refuse_bad_values_naming_them() {
    let cases: &[(&[&str], &str)] = &[
        (&["--drift-factor", "abc"], "abc"),
        (&["--drift-factor", "1.5"], "1.5"),
        (&["--max-extensions", "-1"], "-1"),
        (&["--grace", "0s"], "0s"),
        (&["--retry-delay", "5"], "'5'"),
        (&["--max-hold", "-1s"], "-1s"),
    ];
    for (flags, needle) in cases {
        let mut cmd = ferrolock();
        cmd.args(["run", "--nodes", "redis://127.0.0.1:1"])
            .args(*flags)
            .args(["k", "--", "true"]);
        let out = output(cmd);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {err}");
        assert!(err.contains(needle), "{flags:?}: {needle:?} not in {err}");
    }
}

/// `scan --long` names a negative duration as the bad value it is, as `run`'s duration flags
/// do: clap took `-1h` for an unknown flag `-1`, and its tip (`-- -1`) would make `-1` the
/// pattern.
#[test]
fn scan_refuses_a_negative_long_naming_it() {
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", "redis://127.0.0.1:1", "--long", "-1h"]);
    let out = output(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(err.contains("\"-1h\": must not be negative"), "{err}");
}

/// `inspect` and `scan` check their node list as `run` does: a bad list is bad usage (64), not
/// an unreachable node (69), and says what is wrong without the password.
#[test]
fn inspect_and_scan_refuse_a_bad_node_list_as_bad_usage() {
    let cases: &[(&str, &str)] = &[
        ("http://u:hunter2@x:1", "http://u:***@x:1"),
        ("", "empty node URL"),
        (",", "empty node URL"),
        ("redis://127.0.0.1:1,redis://127.0.0.1:1/0", "same server"),
        ("redis://127.0.0.1:1?password=hunter2", "unknown parameter"),
    ];
    for (nodes, needle) in cases {
        for command in [
            &["inspect", "--nodes", nodes, "k"][..],
            &["scan", "--nodes", nodes],
        ] {
            let mut cmd = ferrolock();
            cmd.args(command);
            let out = output(cmd);
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(64), "{command:?}: {err}");
            assert!(err.contains(needle), "{command:?}: {needle:?} not in {err}");
            assert!(!err.contains("hunter2"), "{command:?}: {err}");
        }
    }
}

#[test]
fn every_lock_option_of_the_table_is_a_flag() {
    let mut cmd = ferrolock();
    cmd.args(["run", "--help"]);
    let help = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    for o in ferrolock::OPTIONS {
        if matches!(o.scope, ferrolock::OptionScope::Binding(_)) {
            continue;
        }
        let flag = if o.name == "watchdog" {
            "--no-watchdog".to_string()
        } else {
            format!("--{}", o.kebab_case())
        };
        assert!(
            help.contains(&flag),
            "{flag} missing from `ferrolock run --help`"
        );
    }
}

#[test]
fn inspect_and_scan_show_every_kind_of_lock_without_writing() {
    let server = RedisServer::start();
    let url = server.url();
    let token = "0123456789abcdef0123456789abcdef";
    server.cmd::<()>(&["SET", "plain", token, "PX", "60000"]);
    server.cmd::<()>(&["SET", "leaked", token]); // no ttl
    let field = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f:42";
    server.cmd::<()>(&["HSET", "redisson", field, "2"]);
    server.cmd::<()>(&["PEXPIRE", "redisson", "30000"]);
    server.cmd::<()>(&["SET", "not-a-lock", "hello"]);
    server.cmd::<()>(&["RPUSH", "a-list", "x"]);
    server.cmd::<()>(&["SET", "ferrolock:fence:{plain}", "7"]);
    // A release's latch (issue 29 item 1): a short-lived record, never a lock.
    let latch = ferrolock::latch_key("plain", token);
    server.cmd::<()>(&["SET", &latch, "1", "PX", "60000"]);
    // ferrolock tokens carry their grant's time: one granted two hours ago (renewed: its ttl
    // is short), one granted now with a ttl longer than --long below.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let renewed = format!("{:012x}-{}", now_ms - 2 * 3600 * 1000, "ab".repeat(10));
    server.cmd::<()>(&["SET", "renewed", &renewed, "PX", "10000"]);
    let fresh = format!("{now_ms:012x}-{}", "cd".repeat(10));
    server.cmd::<()>(&["SET", "fresh", &fresh, "PX", "60000"]);
    let dirty_before: String = server.cmd(&["INFO", "persistence"]);
    let changes = |info: &str| {
        info.lines()
            .find(|l| l.starts_with("rdb_changes_since_last_save"))
            .map(str::to_string)
    };

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "plain"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("holder token: {token}")), "{text}");
    assert!(text.starts_with("lock \"plain\"\n"), "{text}");
    assert!(text.contains("fence counter: 7"), "{text}");
    assert!(
        !text.contains("held for"),
        "a redis-py token has no time: {text}"
    );

    // A list is no lock (an acquire says so): not one that leaked.
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "a-list"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("not a lock \"a-list\"\n"), "{text}");
    assert!(
        text.contains("type: list") && text.contains("kind: not a lock"),
        "{text}"
    );
    assert!(!text.contains("leaked"), "{text}");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "renewed"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("held for: 2h00m"), "{text}");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &url, "redisson"]);
    let out = output(cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
    assert_eq!(json["nodes"][0]["type"], "hash");
    assert_eq!(json["nodes"][0]["holder"]["owners"][field], "2");
    assert!(json["nodes"][0]["pttl_ms"].as_i64().unwrap() > 0);

    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &url]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("\"leaked\"") && text.contains("LEAKED: no ttl"),
        "{text}"
    );
    assert!(
        text.contains("\"plain\"") && text.contains("\"redisson\""),
        "{text}"
    );
    assert!(
        !text.contains("not-a-lock")
            && !text.contains("ferrolock:fence")
            && !text.contains("ferrolock:latch"),
        "{text}"
    );

    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--long", "20s", "--nodes", &url]);
    let out = output(cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let locks = json["locks"].as_array().unwrap();
    let find = |k: &str| locks.iter().find(|l| l["key"] == k).cloned().unwrap();
    assert_eq!(locks.len(), 5, "{json}");
    assert_eq!(find("leaked")["leaked"], true);
    assert_eq!(
        find("plain")["long"],
        true,
        "no grant time: 60 s ttl over --long 20s"
    );
    assert_eq!(find("plain")["kind"], "plain (redis-py, node-redlock)");
    assert_eq!(find("renewed")["kind"], "plain (ferrolock)");
    assert_eq!(
        find("renewed")["long"],
        true,
        "held 2 h, over --long 20s, ttl 10 s"
    );
    assert!(find("renewed")["held_ms"].as_u64().unwrap() >= 2 * 3600 * 1000);
    assert_eq!(
        find("fresh")["long"],
        false,
        "held under 20 s, whatever its ttl"
    );
    assert_eq!(find("redisson")["held_ms"], serde_json::Value::Null);
    assert_eq!(
        find("redisson")["kind"],
        "reentrant (Redisson RLock layout)"
    );

    let dirty_after: String = server.cmd(&["INFO", "persistence"]);
    assert_eq!(
        changes(&dirty_before),
        changes(&dirty_after),
        "inspect/scan wrote"
    );
}

/// What `inspect` prints of a value read from Redis (a token, an owner field, a reader, a
/// waiter) cannot break its layout or drive the terminal: a newline in a token printed a line
/// of its own ("ttl: none" under a key with a ttl), an escape sequence reached the terminal.
#[test]
fn inspect_text_escapes_control_characters_read_from_redis() {
    let server = RedisServer::start();
    let url = server.url();
    let forged = "tok\n  ttl: NONE\u{1b}[2J";
    // A right-to-left override shows text other than what is stored (as in "Trojan Source").
    server.cmd::<()>(&["SET", "odd-bidi", "abc\u{202e}fed", "PX", "60000"]);
    server.cmd::<()>(&["SET", "odd-token", forged, "PX", "60000"]);
    let field = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f\r\u{1b}[31m:1";
    server.cmd::<()>(&["HSET", "odd-owner", field, "1"]);
    server.cmd::<()>(&["PEXPIRE", "odd-owner", "60000"]);
    server.cmd::<()>(&["HSET", "odd-rw", "mode", "write", "w\u{7}:write", "1"]);
    server.cmd::<()>(&["PEXPIRE", "odd-rw", "60000"]);
    server.cmd::<()>(&["SET", "odd-queued", "t", "PX", "60000"]);
    server.cmd::<()>(&[
        "ZADD",
        &ferrolock::queue_key("odd-queued"),
        "1",
        "waiter\none",
    ]);
    for key in ["odd-token", "odd-owner", "odd-rw", "odd-queued"] {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--nodes", &url, key]);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{key}: {text}");
        assert!(
            !text.contains(|c: char| c.is_control() && c != '\n'),
            "{key}: a control character printed raw: {text:?}"
        );
        assert!(
            text.lines().skip(2).all(|l| l.starts_with("  ")),
            "{key}: a value broke the layout: {text}"
        );
    }
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "odd-token"]);
    let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    assert!(
        text.contains("holder token: tok\\n  ttl: NONE\\u{1b}[2J\n"),
        "{text}"
    );
    assert_eq!(text.matches("ttl:").count(), 2, "{text}");
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "odd-bidi"]);
    let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    assert!(text.contains("holder token: abc\\u{202e}fed\n"), "{text:?}");
    // The JSON carries the value as it is (JSON escapes it).
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &url, "odd-token"]);
    let json: serde_json::Value =
        serde_json::from_slice(&output(cmd).stdout).expect("inspect --json");
    assert_eq!(json["nodes"][0]["holder"]["token"], forged);
}

/// A hash laid out as no lock (a user's settings, never expiring) is "not a lock" to
/// `inspect`, as it is to `scan`, which does not list it: `inspect` called it a leaked lock,
/// its fields owners and their values hold counts ("owner name: hold count alice").
#[test]
fn inspect_calls_a_hash_laid_out_as_no_lock_not_a_lock() {
    let server = RedisServer::start();
    let url = server.url();
    server.cmd::<()>(&["HSET", "settings", "name", "alice", "theme", "dark"]);
    let field = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f:42";
    server.cmd::<()>(&["HSET", "leaked-reentrant", field, "2"]);

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "settings"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("not a lock \"settings\"\n"), "{text}");
    assert!(
        !text.contains("leaked") && !text.contains("hold count"),
        "{text}"
    );
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &url, "settings"]);
    let json: serde_json::Value =
        serde_json::from_slice(&output(cmd).stdout).expect("inspect --json");
    assert_eq!(json["nodes"][0]["holder"]["kind"], "not a lock", "{json}");

    // A reentrant lock's hash without a ttl is still one that leaked.
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "leaked-reentrant"]);
    let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    assert!(text.starts_with("lock \"leaked-reentrant\"\n"), "{text}");
    assert!(
        text.contains("a leaked lock") && text.contains(&format!("owner {field}: hold count 2")),
        "{text}"
    );
}

/// What an operator's user needs for `inspect` and `scan` (docs/cli.md states it word for
/// word): read access to the keys, and the commands they send. On a cluster, the topology and
/// a migrating slot's redirect besides.
const INSPECTOR_RULES: &str = "%R~* -@all +scan +type +pttl +strlen +get +getrange +hlen +hkeys +hstrlen +hgetall +zrange +zcard +time";
const INSPECTOR_CLUSTER_RULES: &str = "+cluster|slots +asking";

/// A user with only docs/cli.md's ACL inspects and scans every kind of lock (a fenced plain
/// lock with a waiter, a reentrant one, a read-write lock with a reader, a semaphore with a
/// holder), on a server and on a cluster; a write as that user is refused, so the ACL is in
/// force. docs/cli.md named no ACL for them.
#[test]
fn inspect_and_scan_work_as_a_user_with_the_documented_acl() {
    let doc = format!("{}/../docs/cli.md", env!("CARGO_MANIFEST_DIR"));
    let doc = fs::read_to_string(&doc).expect("docs/cli.md");
    let doc = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        doc.contains(&format!(
            "ACL SETUSER inspector on >password {INSPECTOR_RULES}"
        )) && doc.contains(INSPECTOR_CLUSTER_RULES),
        "docs/cli.md states no ACL for inspect and scan, or another one"
    );
    let user = format!("user inspector on >hunter2 {INSPECTOR_RULES} {INSPECTOR_CLUSTER_RULES}");
    let server = RedisServer::start_with(ferrolock_testbed::ServerOptions {
        acl_users: vec![user.clone()],
        ..Default::default()
    });
    let token = "0123456789abcdef0123456789abcdef";
    server.cmd::<()>(&["SET", "plain", token, "PX", "60000"]);
    server.cmd::<()>(&["SET", &ferrolock::fence_key("plain"), "7"]);
    server.cmd::<()>(&["ZADD", &ferrolock::queue_key("plain"), "1", "waiter-1"]);
    let field = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f:42";
    server.cmd::<()>(&["HSET", "reentrant", field, "1"]);
    server.cmd::<()>(&["PEXPIRE", "reentrant", "60000"]);
    server.cmd::<()>(&["HSET", "rw", "mode", "read", field, "1"]);
    server.cmd::<()>(&["PEXPIRE", "rw", "60000"]);
    let hold = format!("{}:1", ferrolock::rwlock_timeout_prefix("rw", field));
    server.cmd::<()>(&["SET", &hold, "1", "PX", "60000"]);
    server.cmd::<()>(&["SET", "sem", "1"]);
    let (secs, _): (i64, i64) = server.cmd(&["TIME"]);
    let expiry = ((secs + 600) * 1000).to_string();
    server.cmd::<()>(&[
        "ZADD",
        &ferrolock::semaphore_timeout_key("sem"),
        &expiry,
        "p",
    ]);
    let url = format!("redis://inspector:hunter2@127.0.0.1:{}", server.port());
    let mut as_inspector = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let refused = redis::cmd("SET")
        .arg("plain")
        .arg("taken")
        .query::<()>(&mut as_inspector)
        .expect_err("a write as the inspector");
    assert!(
        refused.to_string().to_uppercase().contains("NOPERM"),
        "{refused}"
    );

    let run = |args: &[&str]| {
        let mut cmd = ferrolock();
        cmd.args(args);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };
    for key in ["plain", "reentrant", "rw", "sem"] {
        run(&["inspect", "--nodes", &url, key]);
        run(&["inspect", "--json", "--nodes", &url, key]);
    }
    let text = run(&["scan", "--nodes", &url]);
    assert!(text.contains("3 lock(s), 1 semaphore(s)"), "{text}");
    run(&["scan", "--json", "--nodes", &url]);

    let cluster = RedisCluster::start_with(ferrolock_testbed::ClusterOptions {
        acl_users: vec![user],
        ..Default::default()
    });
    cluster
        .primary_for_key("plain")
        .cmd::<()>(&["SET", "plain", token, "PX", "60000"]);
    let url = format!(
        "redis+cluster://inspector:hunter2@127.0.0.1:{}",
        cluster.nodes[0].port()
    );
    run(&["inspect", "--nodes", &url, "plain"]);
    let text = run(&["scan", "--nodes", &url]);
    assert_eq!(text.matches("1 lock(s)").count(), 1, "{text}");
}

/// `scan`'s LONG flag names the threshold as `--long` was given, in the unit of the "held"
/// beside it: `--long 2h` was shown "held over 7200s", `--long 0s` "ttl over 0ns".
#[test]
fn scan_names_the_long_threshold_as_a_duration_people_read() {
    let server = RedisServer::start();
    let url = server.url();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let renewed = format!("{:012x}-{}", now_ms - 3 * 3600 * 1000, "ab".repeat(10));
    server.cmd::<()>(&["SET", "renewed", &renewed, "PX", "60000"]);
    server.cmd::<()>(&[
        "SET",
        "other",
        "0123456789abcdef0123456789abcdef",
        "PX",
        "60000",
    ]);
    for (long, held, ttl) in [
        ("2h", "LONG: held over 2h00m", None),
        ("90m", "LONG: held over 1h30m", None),
        ("0s", "LONG: held over 0.0s", Some("LONG: ttl over 0.0s")),
    ] {
        let mut cmd = ferrolock();
        cmd.args(["scan", "--nodes", &url, "--long", long]);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        assert!(text.contains(held), "--long {long}: {held:?} not in {text}");
        if let Some(ttl) = ttl {
            assert!(text.contains(ttl), "--long {long}: {ttl:?} not in {text}");
        }
    }
}

/// Every field `inspect --json` and `scan --json` write, for every layout and for a node that
/// could not be read, is described in docs/cli.md: the JSON was documented nowhere.
#[test]
fn every_json_field_of_inspect_and_scan_is_documented() {
    fn names(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    out.insert(k.clone());
                    // A reentrant lock's owners are its hash's fields, not the JSON's.
                    if k != "owners" {
                        names(v, out);
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| names(v, out)),
            _ => {}
        }
    }
    let doc = fs::read_to_string(format!("{}/../docs/cli.md", env!("CARGO_MANIFEST_DIR")))
        .expect("docs/cli.md");
    let server = RedisServer::start();
    let token = "0123456789abcdef0123456789abcdef";
    server.cmd::<()>(&["SET", "plain", token, "PX", "60000"]);
    server.cmd::<()>(&["SET", &ferrolock::fence_key("plain"), "7"]);
    server.cmd::<()>(&["ZADD", &ferrolock::queue_key("plain"), "1", "waiter-1"]);
    server.cmd::<()>(&[
        "ZADD",
        &ferrolock::queue_lease_key("plain"),
        "99",
        "waiter-1",
    ]);
    let field = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f:42";
    server.cmd::<()>(&["HSET", "reentrant", field, "1"]);
    server.cmd::<()>(&[
        "HSET",
        "rw",
        "mode",
        "write",
        &format!("{field}:write"),
        "1",
    ]);
    server.cmd::<()>(&["HSET", "rw", field, "1"]);
    server.cmd::<()>(&["SET", "sem", "1"]);
    server.cmd::<()>(&["ZADD", &ferrolock::semaphore_timeout_key("sem"), "1", "p"]);
    server.cmd::<()>(&["SET", "counter", "3"]);
    server.cmd::<()>(&["RPUSH", "list", "x"]);
    let nodes = format!("{},redis://127.0.0.1:1", server.url());
    let mut found = std::collections::BTreeSet::new();
    let mut json_of = |args: &[&str]| {
        let mut cmd = ferrolock();
        cmd.args(args).args(["--json", "--nodes", &nodes]);
        let out = output(cmd);
        assert_eq!(
            out.status.code(),
            Some(69),
            "{args:?}: the dead node not reported"
        );
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        names(&json, &mut found);
    };
    for key in ["plain", "reentrant", "rw", "sem", "counter", "list", "free"] {
        json_of(&["inspect", key]);
    }
    json_of(&["scan"]);
    let missing: Vec<_> = found
        .iter()
        .filter(|n| !doc.contains(&format!("`{n}`")))
        .collect();
    assert!(missing.is_empty(), "not in docs/cli.md: {missing:?}");
}

/// A name that is not UTF-8 on the command line: `scan` matches it as the bytes it is (a lock
/// whose name is not UTF-8 is found by a pattern of its own bytes), and `inspect`, which reads
/// a lock's text names, refuses it naming the value. Both answered clap's "invalid UTF-8 was
/// detected in one or more arguments", naming neither the argument nor its value.
#[test]
fn a_name_that_is_not_utf8_is_scanned_as_bytes_and_named_by_inspect() {
    use std::os::unix::ffi::OsStrExt;
    let server = RedisServer::start();
    let url = server.url();
    let mut c = server.client();
    redis::cmd("SET")
        .arg(&b"bin\xffname"[..])
        .arg("0123456789abcdef0123456789abcdef")
        .query::<()>(&mut c)
        .unwrap();
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &url])
        .arg(std::ffi::OsStr::from_bytes(b"bin\xff*"));
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("1 lock(s)") && text.contains("LEAKED"),
        "{text}"
    );

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url])
        .arg(std::ffi::OsStr::from_bytes(b"bin\xffname"));
    let out = output(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("the lock key \"bin\\xFFname\" is not UTF-8"),
        "{err}"
    );
}

/// The core takes any key, `ferrolock:nightly` too; `scan` skipped every key under
/// `ferrolock:`, so such a lock (held, or leaked without a ttl) was never listed. Only the
/// core's own derived names (the queue, the fence counter, ...) are not locks.
#[test]
fn scan_lists_a_lock_whose_key_starts_with_ferrolock_but_not_the_cores_own_keys() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tmp();
    let started = dir.path().join("started");
    let key = "ferrolock:nightly";
    let mut holder = ferrolock();
    holder
        .args(["run", "--nodes", &url, "--fence", "--ttl", "20s", key, "--"])
        .args(["sh", "-c", &format!("touch {}; sleep 60", p(&started))]);
    let mut holder = holder.spawn().expect("spawn");
    wait_for("the holder started", || started.exists());
    // A waiter, so that the key's queue exists beside its fence counter.
    let mut waiter = ferrolock();
    waiter.args(["run", "--nodes", &url, "--fence", key, "--", "true"]);
    let mut waiter = waiter.spawn().expect("spawn");
    wait_for("the waiter queued", || {
        server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key(key)]) > 0
    });
    assert!(
        server
            .cmd::<Option<String>>(&["GET", &ferrolock::fence_key(key)])
            .is_some()
    );

    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &url, "--json"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let keys: Vec<&str> = json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, [key], "{json}");

    // SAFETY: our own unreaped children.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    wait(&mut holder);
    unsafe { libc::kill(waiter.id() as i32, libc::SIGTERM) };
    wait(&mut waiter);
}

/// A node URL with `?protocol=resp3`: Redis answers ZRANGE WITHSCORES with a pair per
/// member there, not one flat list, and `inspect` showed a queue of two waiters as one waiter
/// with an empty id (and a queue of one as none).
#[test]
fn inspect_over_resp3_shows_every_waiter() {
    let server = RedisServer::start();
    let url = server.url();
    let dir = tmp();
    let started = dir.path().join("started");
    let key = "resp3-queue";
    let mut holder = ferrolock();
    holder
        .args(["run", "--nodes", &url, "--ttl", "20s", key, "--"])
        .args(["sh", "-c", &format!("touch {}; sleep 60", p(&started))]);
    let mut holder = holder.spawn().expect("spawn");
    wait_for("the holder started", || started.exists());
    let mut waiters: Vec<Child> = (0..2)
        .map(|_| {
            let mut w = ferrolock();
            w.args(["run", "--nodes", &url, key, "--", "true"]);
            w.spawn().expect("spawn")
        })
        .collect();
    wait_for("both waiters queued", || {
        server.cmd::<i64>(&["ZCARD", &ferrolock::queue_key(key)]) == 2
    });

    let ids = |nodes: &str| -> Vec<String> {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--nodes", nodes, "--json", key]);
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
        json["nodes"][0]["waiters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w["waiter"].as_str().unwrap().to_string())
            .collect()
    };
    let resp2 = ids(&url);
    assert_eq!(resp2.len(), 2, "{resp2:?}");
    assert!(resp2.iter().all(|id| !id.is_empty()), "{resp2:?}");
    assert_eq!(ids(&format!("{url}?protocol=resp3")), resp2);

    // SAFETY: our own unreaped children.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    wait(&mut holder);
    for w in &mut waiters {
        wait(w);
    }
}

/// A database holds binary names and values too (a compressed or pickled value, a binary hash
/// field): none is a lock, and `scan` lists the locks beside them instead of failing the node.
#[test]
fn scan_lists_the_locks_beside_binary_keys_and_values() {
    let server = RedisServer::start();
    let url = server.url();
    let token = "0123456789abcdef0123456789abcdef";
    server.cmd::<()>(&["SET", "plain", token, "PX", "60000"]);
    let binary: &[u8] = b"\x78\x9c\xff\xfe";
    let mut c = server.client();
    let mut set = |args: &[&[u8]]| {
        let mut cmd = redis::cmd(std::str::from_utf8(args[0]).unwrap());
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query::<()>(&mut c).expect("write the binary keys");
    };
    set(&[b"SET", b"blob", binary]);
    set(&[b"HSET", b"blobs", binary, binary]);
    // A binary name holding a lock's token with no ttl: a leak, listed under its name as text.
    set(&[b"SET", b"bin\xffname", token.as_bytes()]);

    for json in [false, true] {
        let mut cmd = ferrolock();
        cmd.args(["scan", "--nodes", &url]);
        if json {
            cmd.arg("--json");
        }
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(
            out.status.code(),
            Some(0),
            "json {json}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        if !json {
            assert!(text.contains("\"plain\""), "{text}");
            assert!(!text.contains("blob"), "{text}");
            continue;
        }
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
        let mut keys: Vec<&str> = json["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["key"].as_str().unwrap())
            .collect();
        keys.sort();
        assert_eq!(keys, ["bin\u{FFFD}name", "plain"], "{json}");
        let leaked = json["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["key"] == "bin\u{FFFD}name")
            .unwrap();
        assert_eq!(leaked["leaked"], true, "{json}");
    }
}

/// A hash is a read-write lock when it is laid out as one (`mode` read or write, beside hold
/// counts), not for having a `mode` field: a user's settings hash without a ttl is no leaked
/// lock, and `inspect` does not call it a read-write lock.
#[test]
fn a_hash_with_a_mode_field_is_no_read_write_lock_unless_laid_out_as_one() {
    let server = RedisServer::start();
    let url = server.url();
    server.cmd::<()>(&["HSET", "settings:1", "mode", "dark", "theme", "solarized"]);
    let writer = "8e4d9a3c-1b2f-4c5d-9e6f-0a1b2c3d4e5f:42:write";
    server.cmd::<()>(&["HSET", "rw-leaked", "mode", "write", writer, "1"]);

    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &url]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let locks = json["locks"].as_array().unwrap();
    let keys: Vec<&str> = locks.iter().map(|l| l["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["rw-leaked"], "{json}");
    assert_eq!(locks[0]["leaked"], true, "{json}");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &url, "settings:1"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
    assert_ne!(json["nodes"][0]["holder"]["kind"], "read-write", "{json}");
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "rw-leaked"]);
    let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    assert!(
        text.starts_with("read-write lock \"rw-leaked\"\n"),
        "{text}"
    );
}

#[test]
fn stats_prints_the_counts_of_the_run() {
    let server = RedisServer::start();
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "--stats",
        "jobs:42",
        "--",
        "true",
    ]);
    let out = output(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains("ferrolock_grants_total{prefix=\"jobs\"} 1\n"),
        "{err}"
    );
    assert!(
        err.contains("ferrolock_hold_seconds_count{prefix=\"jobs\"} 1\n"),
        "{err}"
    );
}

/// A semaphore permit whose lease ran out (its holder died unreleased: the permit stays in
/// the zset until the next acquire reclaims it) is shown as lapsed, and the permits available
/// count it. `inspect` showed "lease -5000 ms" (as if a lease could be negative), and an
/// available count one short of what the next acquire finds.
#[test]
fn inspect_shows_a_lapsed_semaphore_permit_as_lapsed() {
    let server = RedisServer::start();
    let url = server.url();
    let (secs, micros): (i64, i64) = server.cmd(&["TIME"]);
    let now_ms = secs * 1000 + micros / 1000;
    let timeout_key = ferrolock::semaphore_timeout_key("sem");
    server.cmd::<()>(&["SET", "sem", "1"]);
    let (lapsed, live) = (now_ms - 5000, now_ms + 600_000);
    server.cmd::<()>(&["ZADD", &timeout_key, &lapsed.to_string(), "dead"]);
    server.cmd::<()>(&["ZADD", &timeout_key, &live.to_string(), "live"]);

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "sem"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // Permit ids are shown in hex: "dead" is 64656164.
    assert!(text.contains("permit 64656164: lease lapsed"), "{text}");
    assert!(text.contains("permits available: 2 "), "{text}");
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &url, "sem"]);
    let json: serde_json::Value =
        serde_json::from_slice(&output(cmd).stdout).expect("inspect --json");
    let holder = &json["nodes"][0]["holder"];
    assert_eq!(holder["available"], 2, "{json}");
    assert_eq!(holder["permits"][0]["id"], "64656164", "{json}");
    assert_eq!(holder["permits"][0]["lease_ms"], serde_json::Value::Null);
    assert!(
        holder["permits"][1]["lease_ms"].as_i64().unwrap() > 0,
        "{json}"
    );
    // What the next acquire finds: the lapsed permit back, 2 available.
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &url,
        "--semaphore",
        "sem",
        "--permits",
        "3",
        "--count",
        "2",
        "--wait",
        "0",
        "--",
        "true",
    ]);
    let out = output(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A read-write lock whose reader field is not UTF-8 (a client's binary owner id) is shown,
/// the field with U+FFFD for the bad bytes and its hold's lease read from the hold's key under
/// the field's own bytes. `inspect` failed the node, exit 69 ("Cannot convert from UTF-8"),
/// though the node answered and `scan` listed the lock.
#[test]
fn inspect_shows_a_read_write_lock_whose_reader_field_is_not_utf8() {
    let server = RedisServer::start();
    let url = server.url();
    let field: &[u8] = b"\xff\xfe-owner:1";
    let empty = ferrolock::rwlock_timeout_prefix("rw", "");
    let mut hold = empty
        .strip_suffix(":rwlock_timeout")
        .unwrap()
        .as_bytes()
        .to_vec();
    hold.extend_from_slice(field);
    hold.extend_from_slice(b":rwlock_timeout:1");
    let mut c = server.client();
    redis::cmd("HSET")
        .arg("rw")
        .arg("mode")
        .arg("read")
        .arg(field)
        .arg(1)
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("PEXPIRE")
        .arg("rw")
        .arg(60000)
        .query::<()>(&mut c)
        .unwrap();
    redis::cmd("SET")
        .arg(&hold)
        .arg(1)
        .arg("PX")
        .arg(60000)
        .query::<()>(&mut c)
        .unwrap();

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, "rw"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains("reader \u{fffd}\u{fffd}-owner:1: hold count 1, leases "),
        "{text}"
    );
    assert!(
        !text.contains("lapsed"),
        "the hold's key was not found: {text}"
    );
}

/// A read hold whose lease ran out (a reader without renewal beside a longer one keeps its
/// count in the hash, its own key gone): `inspect` says it lapsed. It showed the PTTL of the
/// missing key, "leases -2 ms" (and -2 in the JSON), as if 2 ms had been left.
#[test]
fn inspect_shows_a_lapsed_read_hold_as_lapsed_not_minus_two_ms() {
    let server = RedisServer::start();
    let key = "report";
    let (live, lapsed) = (
        "11111111-2222-3333-4444-555555555555:1",
        "66666666-7777-8888-9999-000000000000:2",
    );
    server.cmd::<i64>(&["HSET", key, "mode", "read", live, "1", lapsed, "1"]);
    server.cmd::<i64>(&["PEXPIRE", key, "60000"]);
    let live_hold = format!("{}:1", ferrolock::rwlock_timeout_prefix(key, live));
    server.cmd::<String>(&["SET", &live_hold, "1", "PX", "60000"]);
    let inspect = |json: bool| {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--nodes", &server.url(), key]);
        if json {
            cmd.arg("--json");
        }
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = inspect(false);
    assert!(
        text.contains(&format!("reader {lapsed}: hold count 1, leases lapsed\n")),
        "{text}"
    );
    assert!(
        text.contains(&format!("reader {live}: hold count 1, leases ")),
        "{text}"
    );
    assert!(!text.contains("-2 ms"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&inspect(true)).unwrap();
    let readers = &json["nodes"][0]["holder"]["readers"];
    let leases = |owner: &str| {
        readers
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["owner"] == owner)
            .map(|r| r["leases_ms"].clone())
            .unwrap()
    };
    assert_eq!(leases(lapsed), serde_json::json!([null]), "{json}");
    assert!(leases(live)[0].as_i64().is_some_and(|ms| ms > 0), "{json}");
}

/// A read hold's key with no expiry (set by hand, PTTL -1) and a permit whose lease ended but
/// that no acquire has reclaimed yet: `inspect` says so. It showed "leases -1 ms" and
/// "lease -<ms since its end> ms", as if a lease were left.
#[test]
fn inspect_shows_a_lease_with_no_expiry_or_past_its_end_as_such_not_negative() {
    let server = RedisServer::start();
    let (rw, owner) = ("by-hand", "11111111-2222-3333-4444-555555555555:1");
    server.cmd::<i64>(&["HSET", rw, "mode", "read", owner, "1"]);
    let hold = format!("{}:1", ferrolock::rwlock_timeout_prefix(rw, owner));
    server.cmd::<String>(&["SET", &hold, "1"]);
    assert_eq!(server.cmd::<i64>(&["PTTL", &hold]), -1);
    let sem = "sem-lapsed";
    server.cmd::<String>(&["SET", sem, "1"]);
    // Scored 1 s after the epoch: its lease ended long ago by the server's clock.
    server.cmd::<i64>(&[
        "ZADD",
        &format!("{{{sem}}}:timeout"),
        "1000",
        "0123456789abcdef",
    ]);
    let inspect = |key: &str, json: bool| {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--nodes", &server.url(), key]);
        if json {
            cmd.arg("--json");
        }
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = inspect(rw, false);
    assert!(
        text.contains(&format!(
            "reader {owner}: hold count 1, leases none (no expiry)\n"
        )),
        "{text}"
    );
    let json: serde_json::Value = serde_json::from_str(&inspect(rw, true)).unwrap();
    assert_eq!(
        json["nodes"][0]["holder"]["readers"][0]["leases_ms"],
        serde_json::json!([-1]),
        "the PTTL convention, as pttl_ms: {json}"
    );
    let text = inspect(sem, false);
    assert!(
        text.contains("permit 30313233343536373839616263646566: lease lapsed\n"),
        "{text}"
    );
    assert!(!text.contains("lease -"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&inspect(sem, true)).unwrap();
    assert_eq!(
        json["nodes"][0]["holder"]["permits"][0]["lease_ms"],
        serde_json::Value::Null,
        "{json}"
    );
}

/// A semaphore whose counter is below zero beside its holders (Redisson's `addPermits(-n)`
/// shrinks a pool under them) is shown as a semaphore with its count, not as a plain lock
/// whose token is "-1".
#[test]
fn inspect_shows_a_semaphore_counter_below_zero_as_a_semaphore() {
    let server = RedisServer::start();
    let sem = "sem-shrunk";
    server.cmd::<String>(&["SET", sem, "-1"]);
    // Held until far in the future, by the server's clock.
    server.cmd::<i64>(&[
        "ZADD",
        &format!("{{{sem}}}:timeout"),
        "99999999999999",
        "0123456789abcdef",
    ]);
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &server.url(), sem]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("semaphore \"sem-shrunk\"\n"), "{text}");
    assert!(text.contains("permits available: -1\n"), "{text}");
    assert!(!text.contains("holder token"), "{text}");
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &server.url()]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("1 semaphore(s)"), "{text}");
}

/// Read-write locks and semaphores taken through the core's API (Redisson's layouts): inspect
/// shows the mode, the readers with their hold counts and each hold's lease, the writer, the
/// available permits and each permit id with its lease; scan lists the read-write locks and the
/// semaphore with holders by kind, never a semaphore counter (no TTL by design) or a read hold's
/// own key as leaked or as a plain lock, and still flags a real leak.
#[test]
fn inspect_and_scan_show_read_write_locks_and_semaphores() {
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let m = ferrolock::LockManager::new(
        ferrolock::ManagerOptions::new()
            .nodes([url.clone()])
            .restart_guard(Duration::ZERO)
            .lock(
                ferrolock::LockOptions::default()
                    .watchdog(false)
                    .ttl(Duration::from_secs(30)),
            ),
    )
    .expect("manager");
    let opts = ferrolock::LockOptions::default()
        .watchdog(false)
        .ttl(Duration::from_secs(30));
    let _held = rt.block_on(async {
        let r1 = m.read_lock_owned("rw-read", 7, &opts).await.unwrap();
        let r1_again = m.read_lock_owned("rw-read", 7, &opts).await.unwrap();
        let r2 = m.read_lock("rw-read").await.unwrap();
        let w = m.write_lock("rw-write").await.unwrap();
        let permits = m.semaphore_with("sem-held", 3, 2, &opts).await.unwrap();
        // A semaphore with no holder: its counter stays, its zset goes.
        m.semaphore("sem-idle", 2)
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
        (r1, r1_again, r2, w, permits)
    });
    server.cmd::<()>(&["SET", "leaked", "0123456789abcdef0123456789abcdef"]);
    let read_hold_keys: Vec<String> = server.cmd(&["KEYS", "*rwlock_timeout*"]);
    assert_eq!(
        read_hold_keys.len(),
        3,
        "three read holds: {read_hold_keys:?}"
    );
    assert_eq!(
        server.cmd::<i64>(&["PTTL", "sem-held"]),
        -1,
        "a counter has no ttl"
    );
    assert_eq!(server.cmd::<i64>(&["EXISTS", "{sem-idle}:timeout"]), 0);

    let inspect = |key: &str| {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--json", "--nodes", &url, key]);
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--nodes", &url, key]);
        let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
        assert!(!text.contains("leaked"), "{text}");
        (json["nodes"][0]["holder"].clone(), text)
    };
    let (rw, text) = inspect("rw-read");
    assert_eq!(rw["kind"], "read-write", "{rw}");
    assert_eq!(rw["mode"], "read", "{rw}");
    assert!(rw["writer"].is_null(), "{rw}");
    let readers = rw["readers"].as_array().unwrap();
    assert_eq!(readers.len(), 2, "{rw}");
    let mut holds: Vec<u64> = readers
        .iter()
        .map(|r| r["holds"].as_u64().unwrap())
        .collect();
    holds.sort();
    assert_eq!(holds, [1, 2], "{rw}");
    for r in readers {
        let leases = r["leases_ms"].as_array().unwrap();
        assert_eq!(leases.len() as u64, r["holds"].as_u64().unwrap(), "{rw}");
        for l in leases {
            let ms = l.as_i64().unwrap();
            assert!(ms > 0 && ms <= 30_000, "a hold's lease: {rw}");
        }
    }
    assert!(
        text.contains("mode: read") && text.contains("hold count 2"),
        "{text}"
    );
    assert!(text.starts_with("read-write lock \"rw-read\"\n"), "{text}");

    let (rw, text) = inspect("rw-write");
    assert_eq!(
        (rw["kind"].as_str(), rw["mode"].as_str()),
        (Some("read-write"), Some("write")),
        "{rw}"
    );
    assert_eq!(rw["writer"]["holds"], 1, "{rw}");
    assert!(rw["readers"].as_array().unwrap().is_empty(), "{rw}");
    assert!(text.contains("writer "), "{text}");

    let (sem, text) = inspect("sem-held");
    assert_eq!(sem["kind"], "semaphore", "{sem}");
    assert_eq!(sem["available"], 1, "3 permits, 2 taken: {sem}");
    let permits = sem["permits"].as_array().unwrap();
    assert_eq!(permits.len(), 2, "{sem}");
    for p in permits {
        let id = p["id"].as_str().unwrap();
        assert!(
            id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{sem}"
        );
        let ms = p["lease_ms"].as_i64().unwrap();
        assert!(ms > 0 && ms <= 30_000, "{sem}");
    }
    assert!(text.contains("permits available: 1"), "{text}");
    assert!(text.starts_with("semaphore \"sem-held\"\n"), "{text}");

    let (sem, text) = inspect("sem-idle");
    assert_eq!(sem["kind"], "semaphore or counter", "{sem}");
    assert_eq!(sem["available"], 2, "{sem}");
    assert!(text.contains("permit holders: none"), "{text}");
    assert!(
        text.starts_with("semaphore or counter \"sem-idle\"\n"),
        "{text}"
    );

    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &url]);
    let out = output(cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let locks = json["locks"].as_array().unwrap();
    let find = |k: &str| locks.iter().find(|l| l["key"] == k).cloned();
    let kind = |k: &str| find(k).map(|l| l["kind"].as_str().unwrap_or("").to_string());
    assert_eq!(
        kind("rw-read").as_deref(),
        Some("read-write (Redisson RReadWriteLock layout)"),
        "{json}"
    );
    assert_eq!(
        kind("rw-write").as_deref(),
        Some("read-write (Redisson RReadWriteLock layout)"),
        "{json}"
    );
    assert_eq!(
        kind("sem-held").as_deref(),
        Some("semaphore (Redisson RPermitExpirableSemaphore layout)"),
        "{json}"
    );
    assert!(
        find("sem-idle").is_none(),
        "a counter with no holder is not a lock: {json}"
    );
    for k in &read_hold_keys {
        assert!(
            find(k).is_none(),
            "a read hold key is part of its lock: {json}"
        );
    }
    let leaked: Vec<&serde_json::Value> = locks.iter().filter(|l| l["leaked"] == true).collect();
    assert_eq!(leaked.len(), 1, "only the real leak: {json}");
    assert_eq!(leaked[0]["key"], "leaked");
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &url]);
    let text = String::from_utf8_lossy(&output(cmd).stdout).into_owned();
    assert_eq!(text.matches("LEAKED").count(), 1, "{text}");
    // The semaphore is counted as one, not among the locks: 2 read-write locks and the leak.
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.ends_with(": 3 lock(s), 1 semaphore(s)")),
        "{text}"
    );
}

/// Semaphores a real Redisson 4.7.0 client holds under names with braces, which Redisson takes
/// (the core refuses them): a hash tag (`jobs{1}`, ids in `jobs{1}:timeout`, not
/// `{jobs{1}}:timeout`), a `{` that starts no tag (`jobs{2`) and a `}` alone (`jobs}3`, ids in
/// `{jobs}3}:timeout`). inspect shows their holders (the ids as Redisson shows them) and scan
/// lists them, as for a name without braces. Before, inspect said "permit holders: none" and
/// scan left them out.
#[test]
fn inspect_and_scan_show_redisson_semaphores_named_with_braces() {
    const NAMES: [&str; 4] = ["jobs{1}", "jobs{2", "jobs}3", "jobs"];
    let classpath = redisson::redisson_classpath();
    let server = RedisServer::start();
    let url = server.url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let reply = Duration::from_secs(30);
    let (mut r, ids) = rt.block_on(async {
        let mut r = redisson::Redisson::start(classpath, &url, "single").await;
        let mut ids = Vec::new();
        for name in NAMES {
            r.send(&format!("ssetpermits {name} 3")).await;
            r.expect(&format!("ssetpermits {name} true"), reply).await;
            r.send(&format!("sacquire {name} 2 120000")).await;
            let line = r.expect(&format!("sacquire {name} "), reply).await;
            let mut held: Vec<String> = line[format!("sacquire {name} ").len()..]
                .split(',')
                .map(str::to_string)
                .collect();
            held.sort();
            assert_eq!(held.len(), 2, "{line}");
            ids.push(held);
        }
        (r, ids)
    });
    // Where Redisson keeps each name's ids.
    for zset in [
        "jobs{1}:timeout",
        "jobs{2:timeout",
        "{jobs}3}:timeout",
        "{jobs}:timeout",
    ] {
        assert_eq!(server.cmd::<i64>(&["ZCARD", zset]), 2, "{zset}");
    }
    for (name, held) in NAMES.into_iter().zip(&ids) {
        let mut cmd = ferrolock();
        cmd.args(["inspect", "--json", "--nodes", &url, name]);
        let out = output(cmd);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
        let sem = &json["nodes"][0]["holder"];
        assert_eq!(sem["kind"], "semaphore", "{name}: {sem}");
        assert_eq!(sem["available"], 1, "{name}: {sem}");
        let mut shown: Vec<String> = sem["permits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_string())
            .collect();
        shown.sort();
        assert_eq!(&shown, held, "{name}: Redisson's ids");
    }
    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &url]);
    let out = output(cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let mut listed: Vec<(String, String)> = json["locks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap().to_string(),
                l["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    listed.sort();
    let semaphore = "semaphore (Redisson RPermitExpirableSemaphore layout)".to_string();
    let mut expected: Vec<(String, String)> = NAMES
        .iter()
        .map(|n| (n.to_string(), semaphore.clone()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected, "{json}");
    rt.block_on(r.send("quit"));
}

#[test]
fn inspect_and_scan_on_a_cluster_ask_its_primaries_without_writing() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    // One ferrolock lock on each primary (found by slot), written where a client would.
    let mut keys = Vec::new();
    for (n, p) in cluster.primaries().iter().enumerate() {
        let key = (0..)
            .map(|i| format!("jobs:{i}"))
            .find(|k| cluster.primary_for_key(k).port() == p.port() && !keys.contains(k))
            .unwrap();
        let token = format!("{now_ms:012x}-{:020x}", n);
        p.cmd::<()>(&["SET", &key, &token, "PX", "60000"]);
        keys.push(key);
    }
    let changes = || -> Vec<Option<String>> {
        cluster
            .primaries()
            .iter()
            .map(|p| {
                let info: String = p.cmd(&["INFO", "persistence"]);
                info.lines()
                    .find(|l| l.starts_with("rdb_changes_since_last_save"))
                    .map(str::to_string)
            })
            .collect()
    };
    let before = changes();

    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &url, "jobs:*"]);
    let out = output(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let locks = json["locks"].as_array().unwrap();
    for (key, p) in keys.iter().zip(cluster.primaries()) {
        let found: Vec<_> = locks.iter().filter(|l| l["key"] == key.as_str()).collect();
        assert_eq!(found.len(), 1, "{key}: {json}");
        assert_eq!(found[0]["kind"], "plain (ferrolock)");
        let node = found[0]["node"].as_str().unwrap();
        assert!(node.ends_with(&format!(":{}", p.port())), "{key} on {node}");
    }
    assert_eq!(locks.len(), keys.len(), "{json}");

    // inspect asks the primary that serves the key's slot only.
    let key = &keys[2];
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, key]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let port = cluster.primary_for_key(key).port();
    assert!(
        text.contains(&format!("primary 127.0.0.1:{port}:")),
        "{text}"
    );
    assert!(
        text.contains(&format!("holder token: {now_ms:012x}-")),
        "{text}"
    );

    assert_eq!(before, changes(), "inspect/scan wrote");
}

/// Two seeds of one cluster given as two nodes: `scan` listed every primary, and every lock,
/// once per seed. The second seed's cluster is now named as the first's, its locks listed
/// once.
#[test]
fn scan_of_two_seeds_of_one_cluster_lists_each_lock_once() {
    let cluster = RedisCluster::start();
    let key_on = |p: &RedisServer| {
        (0..)
            .map(|i| format!("twice:{i}"))
            .find(|k| cluster.primary_for_key(k).port() == p.port())
            .unwrap()
    };
    let keys: Vec<String> = cluster.primaries().iter().map(key_on).collect();
    for (n, (key, p)) in keys.iter().zip(cluster.primaries()).enumerate() {
        let token = format!("{:012x}-{n:020x}", 1u64 << 40);
        p.cmd::<()>(&["SET", key, &token, "PX", "60000"]);
    }
    let seed = |i: usize| format!("redis+cluster://127.0.0.1:{}", cluster.nodes[i].port());
    let nodes = format!("{},{}", seed(0), seed(1));
    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &nodes, "twice:*"]);
    let out = output(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    let locks = json["locks"].as_array().unwrap();
    for key in &keys {
        let found = locks.iter().filter(|l| l["key"] == key.as_str()).count();
        assert_eq!(found, 1, "{key}: {json}");
    }
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &nodes, "twice:*"]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!("{}: the same cluster as {}", seed(1), seed(0))),
        "{text}"
    );
}

/// A number at a key with a hash tag (a counter, `{user7}:visits`) with no permit ids beside
/// it (Redisson's `{user7}:visits:timeout`, in its slot) is no semaphore's. On a Redis Cluster
/// `{name}:timeout` is in another slot, often on another primary: `scan` and `inspect` must not
/// ask for it there (MOVED). A number at a name with a `}` alone (`visits}3`) has its
/// Redisson zset (`{visits}3}:timeout`) in another slot: the MOVED that answers its read means
/// no holder (Redisson's scripts cannot take permits there), not a failed node.
#[test]
fn scan_and_inspect_on_a_cluster_read_a_tagged_counter_in_its_own_slot() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let port = |k: &str| cluster.primary_for_key(k).port();
    let counter = (0..)
        .map(|i| format!("{{user{i}}}:visits"))
        .find(|k| port(k) != port(&ferrolock::semaphore_timeout_key(k)))
        .unwrap();
    let primary = cluster.primary_for_key(&counter);
    primary.cmd::<()>(&["SET", &counter, "17"]);
    let split = (0..)
        .map(|i| format!("visits}}{i}"))
        .find(|k| port(k) != port(&format!("{{{k}}}:timeout")))
        .unwrap();
    cluster
        .primary_for_key(&split)
        .cmd::<()>(&["SET", &split, "5"]);
    // A lock beside it, in the same slot, which `scan` lists.
    let lock = counter.replace(":visits", ":lock");
    let token = "0123456789abcdef0123456789abcdef";
    primary.cmd::<()>(&["SET", &lock, token, "PX", "60000"]);

    let mut cmd = ferrolock();
    cmd.args(["scan", "--json", "--nodes", &url]);
    let out = output(cmd);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan --json");
    assert_eq!(out.status.code(), Some(0), "{json}");
    let locks = json["locks"].as_array().unwrap();
    assert!(locks.iter().all(|l| l["error"].is_null()), "{json}");
    let keys: Vec<&str> = locks.iter().map(|l| l["key"].as_str().unwrap()).collect();
    assert_eq!(keys, [lock.as_str()], "{json}");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, &counter]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("permits available: 17"), "{text}");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, &split]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("permits available: 5") && text.contains("permit holders: none"),
        "{text}"
    );
}

/// Another client's lock under a key with a `}` and no hash tag (a redis-py lock `job}3`, a name
/// ferrolock refuses for its own locks) has no fence counter or queue of ferrolock's, whose
/// names would hash to another slot: on a Redis Cluster, `inspect` shows it without asking
/// another slot for them (MOVED).
#[test]
fn inspect_on_a_cluster_shows_a_lock_whose_key_has_a_brace_and_no_tag() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let port = |k: &str| cluster.primary_for_key(k).port();
    let key = (0..)
        .map(|i| format!("job}}{i}"))
        .find(|k| port(k) != port(&ferrolock::fence_key(k)))
        .unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    cluster
        .primary_for_key(&key)
        .cmd::<()>(&["SET", &key, token, "PX", "60000"]);

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, &key]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(&format!("holder token: {token}")), "{text}");
    assert!(text.contains("waiters: none"), "{text}");
}

/// `run --read` and `--write` stop COMMAND and exit 70 when their hold is lost, as `run`
/// does for a lock: the read-write lock's hash is deleted under them.
#[test]
fn a_lost_read_or_write_hold_stops_the_child_and_exits_70() {
    let server = RedisServer::start();
    for side in ["--read", "--write"] {
        let dir = tmp();
        let started = dir.path().join("started");
        let script = format!("touch {}; while :; do sleep 0.05; done", p(&started));
        let key = format!("rw-lost{side}");
        let mut cmd = ferrolock();
        cmd.args([
            "run",
            "--nodes",
            &server.url(),
            "--ttl",
            "2s",
            "--grace",
            "1s",
            side,
        ])
        .args([key.as_str(), "--", "sh", "-c", &script]);
        let mut run = cmd.stderr(Stdio::piped()).spawn().expect("spawn");
        wait_for("the child started", || started.exists());
        assert_eq!(
            server.cmd::<i64>(&["DEL", &key]),
            1,
            "{side}: the hash was there"
        );
        let status = wait(&mut run);
        let mut err = String::new();
        std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(70), "{side}: {err}");
        // Found by a renewal (not by a lease running out unrenewed).
        assert!(err.contains("our token is gone"), "{side}: {err}");
    }
}

/// Kills a process at the end of a test, whatever its outcome (a grandchild the run under
/// test failed to stop must not outlive the test).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: plain syscall; the pid is gone already when the test passed.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}

/// A `run` whose COMMAND (`sh -c`) starts `grandchild` (a script file) in the background, in
/// its process group, and then loops until SIGTERM ends it. Returns once both run, with the
/// grandchild's pid; the test then deletes the key to have the lock lost.
fn run_with_a_background_grandchild(
    server: &RedisServer,
    dir: &Path,
    key: &str,
    grace: &str,
    grandchild: &str,
) -> (Child, i32) {
    let (script, pidfile, started) = (
        dir.join("grandchild.sh"),
        dir.join("grandchild.pid"),
        dir.join("started"),
    );
    fs::write(&script, grandchild).unwrap();
    let command = format!(
        "sh {script} & echo $! > {pid}; touch {started}; while :; do sleep 0.05; done",
        script = p(&script),
        pid = p(&pidfile),
        started = p(&started)
    );
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url(), "--ttl", "2s"])
        .args(["--grace", grace, key, "--", "sh", "-c", &command]);
    // Not piped: the grandchild holds our stderr as long as it lives.
    let run = cmd.stderr(Stdio::null()).spawn().expect("spawn");
    wait_for("the child started", || started.exists());
    let pid = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (run, pid)
}

/// After a loss, what COMMAND started in its process group gets SIGKILL at the end of the
/// grace even when COMMAND itself exited at the SIGTERM: `run` used to stop watching the group
/// once COMMAND was gone, and a grandchild that ignores SIGTERM ran on without the lock.
#[test]
fn a_lost_lock_kills_what_outlives_command_in_its_group_after_the_grace() {
    let server = RedisServer::start();
    let dir = tmp();
    let trapped = dir.path().join("trapped");
    // Ignores SIGTERM (kept across the exec), says so, then sleeps far past the test.
    let grandchild = format!("trap '' TERM; touch {}; exec sleep 600", p(&trapped));
    let (mut run, pid) =
        run_with_a_background_grandchild(&server, dir.path(), "outlived", "2s", &grandchild);
    let _cleanup = KillOnDrop(pid);
    wait_for("the grandchild ignores SIGTERM", || trapped.exists());
    assert!(alive(pid));
    assert_eq!(server.cmd::<i64>(&["DEL", "outlived"]), 1);
    assert_eq!(wait(&mut run).code(), Some(70));
    // SIGKILL was sent before ferrolock exited; the grandchild's new parent reaps it.
    wait_for("the grandchild was killed", || !alive(pid));
}

/// After a loss, ferrolock waits for what COMMAND started in its group to stop on the
/// SIGTERM (here it takes a second), and exits 70 once the group is empty: not as soon as
/// COMMAND exits, and not only at the end of the (here 10 minute) grace.
#[test]
fn a_lost_lock_waits_for_the_group_to_stop_not_only_for_command() {
    let server = RedisServer::start();
    let dir = tmp();
    let stopped = dir.path().join("stopped");
    let grandchild = format!(
        "trap 'sleep 1; touch {}; exit 0' TERM; while :; do sleep 0.05; done",
        p(&stopped)
    );
    let (mut run, pid) =
        run_with_a_background_grandchild(&server, dir.path(), "slow-stop", "600s", &grandchild);
    let _cleanup = KillOnDrop(pid);
    assert_eq!(server.cmd::<i64>(&["DEL", "slow-stop"]), 1);
    // `wait` fails past 30 s: the grace (600 s) did not run out.
    assert_eq!(wait(&mut run).code(), Some(70));
    assert!(
        stopped.exists(),
        "ferrolock exited while the grandchild was still stopping"
    );
}

/// `--no-watchdog` with `--max-hold` stops COMMAND as for a lost lock (exit 70) before the
/// validity ends, here the ttl's (2 s, before --max-hold's 30 s), as the help now says (it
/// said that with --no-watchdog ferrolock only warns). Without --max-hold it only warns
/// (`validity_warning_is_printed_while_the_child_still_runs` in run.rs).
#[test]
fn no_watchdog_with_max_hold_stops_command_before_the_validity_ends_as_the_help_says() {
    let mut help = ferrolock();
    help.args(["run", "--help"]);
    let help = String::from_utf8_lossy(&output(help).stdout).into_owned();
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains(
            "With --no-watchdog and --max-hold, COMMAND is stopped instead, as for a lost lock \
             (exit 70): at --max-hold, or just before the validity ends, whichever comes first."
        ),
        "{help}"
    );

    let server = RedisServer::start();
    let dir = tmp();
    let (started, done) = (dir.path().join("started"), dir.path().join("done"));
    let script = format!("touch {}; sleep 20; touch {}", p(&started), p(&done));
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "--no-watchdog",
        "--ttl",
        "2s",
    ])
    .args(["--max-hold", "30s", "nw", "--", "sh", "-c", &script]);
    let out = output(cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(started.exists(), "{err}");
    assert!(!done.exists(), "COMMAND ran to its end: {err}");
    assert!(
        err.contains("running out") && err.contains("SIGTERM now"),
        "{err}"
    );
    // The countdown in whole milliseconds ("SIGKILL in 1.32s"), not in nanoseconds.
    let countdown = err
        .split("SIGKILL in ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no countdown in {err}"));
    let decimals = countdown
        .trim_end_matches(|c: char| c.is_ascii_alphabetic() || c == 'µ')
        .split_once('.')
        .map_or(0, |(_, fraction)| fraction.len());
    assert!(decimals <= 3, "{countdown:?} in {err}");
}

/// The state letter of `/proc/<pid>/stat` (`T`: stopped), or ' ' once it is gone.
fn state(pid: i32) -> char {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
        .unwrap_or(' ')
}

/// The tests below whose COMMAND loops on `sleep` while a stop reaches it run it with bash, not
/// sh: dash starts `sleep` with vfork, and a SIGTSTP that lands between the vfork and the exec
/// stops the new process while dash waits for it in the kernel, where no stop reaches dash
/// (state D): COMMAND is never reported stopped, to ferrolock or, without ferrolock, to a
/// shell (a Ctrl-Z there does nothing). On a loaded machine the window was hit about once in
/// 30 runs of these tests. bash forks.
/// `ferrolock run` in a process group of its own (as a shell runs a job), its child stopping
/// itself with SIGTSTP (as Ctrl-Z stops the terminal's foreground group, which the child has
/// then): returns ferrolock, the child's pid and the file the child touches once continued.
fn run_a_child_that_stops(
    server: &RedisServer,
    dir: &Path,
    key: &str,
    ttl: &str,
) -> (Child, i32, std::path::PathBuf) {
    use std::os::unix::process::CommandExt;
    let pidfile = dir.join("pid");
    let resumed = dir.join("resumed");
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url(), "--ttl", ttl, key, "--"])
        .args([
            "sh",
            "-c",
            &format!(
                "echo $$ > {}; kill -s TSTP $$; touch {}; exit 7",
                p(&pidfile),
                p(&resumed)
            ),
        ])
        .process_group(0)
        .stderr(Stdio::piped());
    let run = cmd.spawn().expect("spawn");
    wait_for("the child wrote its pid", || {
        fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let me = run.id() as i32;
    wait_for("ferrolock stopped with its child", || {
        state(me) == 'T' && state(pid) == 'T'
    });
    (run, pid, resumed)
}

#[test]
fn a_child_stopped_by_ctrl_z_stops_ferrolock_too_and_both_go_on_when_continued() {
    let server = RedisServer::start();
    let dir = tmp();
    let (mut run, _, resumed) = run_a_child_that_stops(&server, dir.path(), "ctrl-z", "30s");
    // Stopped, as its shell's job: the lock stays (a short stop is within the validity).
    assert!(server.cmd::<Option<String>>(&["GET", "ctrl-z"]).is_some());
    // `fg` continues the job, ferrolock: it continues the child.
    // SAFETY: plain syscall.
    unsafe { libc::kill(run.id() as i32, libc::SIGCONT) };
    assert_eq!(wait(&mut run).code(), Some(7));
    assert!(resumed.exists(), "the child never went on");
    assert!(
        server.cmd::<Option<String>>(&["GET", "ctrl-z"]).is_none(),
        "not released"
    );
}

#[test]
fn a_stop_longer_than_the_validity_ends_in_70_without_the_child_going_on() {
    let server = RedisServer::start();
    let dir = tmp();
    let (mut run, _, resumed) = run_a_child_that_stops(&server, dir.path(), "ctrl-z-long", "1s");
    // Stopped, nothing renews: the key expires (the fault this test needs).
    wait_for("the key expired while ferrolock was stopped", || {
        server
            .cmd::<Option<String>>(&["GET", "ctrl-z-long"])
            .is_none()
    });
    // SAFETY: plain syscall.
    unsafe { libc::kill(run.id() as i32, libc::SIGCONT) };
    let status = wait(&mut run);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut run.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(70), "{err}");
    assert!(
        err.contains("validity ended while ferrolock was stopped"),
        "{err}"
    );
    // No countdown to a SIGKILL already due ("SIGKILL in 0ns").
    assert!(err.contains("SIGTERM and SIGKILL now"), "{err}");
    // SIGTERM reached the child before it was continued: it never ran without the lock.
    assert!(
        !resumed.exists(),
        "the child went on after the validity ended"
    );
}

/// `shell job` on a pseudo-terminal (`script`, util-linux), its output piped, so that a ^C
/// written to its stdin is the terminal's SIGINT to the foreground group, as a user's would be.
fn on_a_terminal(shell: &str, job: &Path) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new("script");
    cmd.args(["-qfc", &format!("{shell} {}", p(job)), "/dev/null"])
        // `script` runs its command with $SHELL: the same everywhere.
        .env("SHELL", "/bin/sh")
        .env_remove("FERROLOCK_NODES")
        .env_remove("FERROLOCK_HELD")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // A terminal's shell starts with SIGINT at its default; a test run in the background
    // inherits it ignored, which no trap could then catch.
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    cmd.spawn()
        .expect("`script` (util-linux) runs this test on a pseudo-terminal: install it")
}

/// Types `keys` at the terminal of `script` (from `on_a_terminal`): a ^C (`\x03`) is the
/// terminal's SIGINT to its foreground group, a ^Z (`\x1a`) its SIGTSTP.
fn type_at(script: &mut Child, keys: &[u8]) {
    use std::io::Write;
    let stdin = script.stdin.as_mut().expect("the terminal's input");
    stdin.write_all(keys).unwrap();
    stdin.flush().unwrap();
}

/// Waits for `script` (from `on_a_terminal`) to end, then closes its terminal's input and
/// returns its status and what it wrote.
fn finish(script: &mut Child) -> (std::process::ExitStatus, String) {
    let status = wait(script);
    drop(script.stdin.take());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut script.stdout.take().unwrap(), &mut out).unwrap();
    (status, out)
}

/// Ctrl-C at a terminal: the child had the terminal, so only its group got the SIGINT; once
/// the lock is released, ferrolock sends SIGINT to the group it was started in, as the
/// terminal would have without it (so a shell script's loop stops). A real terminal: `script`
/// (util-linux) runs a shell on a pseudo-terminal and turns the ^C written to it into the
/// terminal's SIGINT; the shell, in ferrolock's group, records the SIGINT it gets with a trap.
#[test]
fn ctrl_c_that_kills_the_command_reaches_the_group_that_started_ferrolock() {
    let server = RedisServer::start();
    let dir = tmp();
    let started = dir.path().join("started");
    let inner = format!(
        // The child says it started once its group has the terminal (fields 5 and 8 of its
        // stat: its group, the terminal's foreground group), so that the ^C below is the
        // terminal's to its group, as a user's would be.
        "trap 'echo the-group-got-sigint' INT; {} run --nodes {} ctrl-c -- sh -c 'until set -- $(cat /proc/$$/stat) && [ $5 = $8 ]; do sleep 0.01; done; touch {}; exec sleep 20'; echo ferrolock-status=$?",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started)
    );
    fs::write(dir.path().join("job.sh"), inner).unwrap();
    let mut script = on_a_terminal("sh", &dir.path().join("job.sh"));
    wait_for("the child started", || started.exists());
    type_at(&mut script, b"\x03");
    let (status, out) = finish(&mut script);
    assert!(status.success(), "{out}");
    assert!(
        out.contains("the-group-got-sigint") && out.contains("ferrolock-status=130"),
        "ferrolock's group never got the SIGINT: {out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "ctrl-c"]).is_none(),
        "not released"
    );
}

/// A Ctrl-C at the terminal while ferrolock still waits for the lock reaches the whole
/// foreground group: ferrolock and the bash script that runs it. bash, waiting for ferrolock,
/// goes on with its script unless ferrolock dies of that SIGINT (it takes an exit status for
/// a SIGINT the program handled on purpose): a loop of `ferrolock run`s went on to the next
/// one, which waited again. ferrolock ends of the SIGINT, as it does for a COMMAND that dies of
/// one, so the script stops (status 130 either way). A real terminal, as in the test above.
#[test]
fn ctrl_c_while_waiting_for_the_lock_stops_the_script_that_runs_ferrolock() {
    let server = RedisServer::start();
    server.cmd::<String>(&["SET", "busy", "someone-else", "PX", "120000"]);
    let dir = tmp();
    let job = format!(
        "{} run --nodes {} busy -- true; echo ferrolock-status=$?; echo the-script-went-on",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url()
    );
    fs::write(dir.path().join("job.sh"), job).unwrap();
    let mut script = on_a_terminal("bash", &dir.path().join("job.sh"));
    // Its connection shows it is past installing the handlers and inside the acquire loop.
    // Not any second client: the test's own earlier connections (the SET, each CLIENT LIST)
    // may still be listed for a moment after they closed, and a Ctrl-C sent then found
    // ferrolock not yet started, or without its handlers.
    wait_for("ferrolock waiting for the lock", || {
        server
            .cmd::<String>(&["CLIENT", "LIST"])
            .lines()
            .any(|c| !c.contains(" cmd=client|list ") && !c.contains(" cmd=set "))
    });
    type_at(&mut script, b"\x03");
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("interrupted by SIGINT while waiting"),
        "the Ctrl-C never reached ferrolock: {out}"
    );
    assert!(
        !out.contains("the-script-went-on"),
        "the script went on after the Ctrl-C: {out}"
    );
    assert_eq!(
        server.cmd::<String>(&["GET", "busy"]),
        "someone-else",
        "the holder's key was touched"
    );
}

/// A ferrolock started in the background and brought to the foreground (`fg`): a Ctrl-C
/// reaches COMMAND, which had no terminal to be given at its start. `fg` gives the terminal to
/// ferrolock's group alone: ferrolock hands it on to COMMAND (see the test below), and a Ctrl-C
/// that reaches ferrolock first is passed on. It was not (ferrolock took itself for sharing
/// the terminal's foreground with COMMAND), and the Ctrl-C did nothing.
#[test]
fn ctrl_c_after_fg_reaches_a_command_that_has_no_terminal() {
    let server = RedisServer::start();
    let dir = tmp();
    let started = dir.path().join("started");
    let pid = dir.path().join("pid");
    let job = format!(
        "set -m\n\
         {} run --nodes {} fg -- sh -c 'trap \"echo command-got-sigint; exit 7\" INT; echo $$ > {}; while :; do sleep 0.1; done' &\n\
         echo $! > {}\n\
         until [ -s {} ]; do sleep 0.05; done\n\
         fg %1 >/dev/null\n\
         echo ferrolock-status=$?\n",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started),
        p(&pid),
        p(&started),
    );
    fs::write(dir.path().join("job.sh"), job).unwrap();
    let mut script = on_a_terminal("sh", &dir.path().join("job.sh"));
    // `fg` done: ferrolock's group or COMMAND's is the terminal's foreground.
    wait_for("ferrolock brought to the foreground", || {
        let (Ok(ferrolock), Ok(child)) = (fs::read_to_string(&pid), fs::read_to_string(&started))
        else {
            return false;
        };
        let f = stat_fields(&ferrolock);
        f.len() > 5 && (f[2] == f[5] || f[5] == child.trim())
    });
    type_at(&mut script, b"\x03");
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("command-got-sigint") && out.contains("ferrolock-status=7"),
        "the Ctrl-C never reached COMMAND: {out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "fg"]).is_none(),
        "not released"
    );
}

/// `ferrolock run ... &` in a script run at a terminal (no job control: the shell starts it
/// with SIGINT ignored, in its own foreground group) is a background command: the terminal
/// stays the script's. ferrolock took it for COMMAND, so the script's next `read` from the
/// terminal failed (or stopped it), and a Ctrl-C reached the background job, not the script.
#[test]
fn a_run_started_with_ampersand_in_a_script_leaves_the_terminal_to_the_script() {
    let server = RedisServer::start();
    let dir = tmp();
    let started = dir.path().join("started");
    let reading = dir.path().join("reading");
    let job = format!(
        "{} run --nodes {} bg-job -- sh -c 'touch {}; exec sleep 30' &\n\
         until [ -e {} ]; do sleep 0.05; done\n\
         touch {}\n\
         read x\n\
         echo read=$x\n\
         kill $!\n\
         wait\n",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started),
        p(&started),
        p(&reading),
    );
    fs::write(dir.path().join("job.sh"), job).unwrap();
    let mut script = on_a_terminal("sh", &dir.path().join("job.sh"));
    wait_for("the script reading the terminal", || reading.exists());
    type_at(&mut script, b"hello\n");
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("read=hello"),
        "the script could not read its terminal: {out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "bg-job"]).is_none(),
        "not released"
    );
}

/// Fields of /proc/PID/stat after the command name (0: state, 2: process group, 5: the
/// terminal's foreground group); empty once the process is gone.
fn stat_fields(pid: &str) -> Vec<String> {
    fs::read_to_string(format!("/proc/{}/stat", pid.trim()))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            Some(rest.split_whitespace().map(String::from).collect())
        })
        .unwrap_or_default()
}

/// `fg` of a ferrolock started in the background hands COMMAND the terminal, as a start in the
/// foreground does: a Ctrl-Z then stops COMMAND, and ferrolock with it. Without it the
/// terminal's Ctrl-Z stopped ferrolock alone, and COMMAND ran on while nothing renewed its
/// lock, past its validity, beside the next holder.
#[test]
fn fg_hands_command_the_terminal_so_ctrl_z_stops_it_with_ferrolock() {
    let server = RedisServer::start();
    let dir = tmp();
    let started = dir.path().join("started");
    let pid = dir.path().join("pid");
    let go = dir.path().join("go");
    let job = format!(
        "set -m\n\
         {} run --nodes {} fg-stop -- bash -c 'trap \"echo command-got-sigint; exit 7\" INT; echo $$ > {}; while :; do sleep 0.1; done' &\n\
         echo $! > {}\n\
         until [ -s {} ]; do sleep 0.05; done\n\
         fg %1 >/dev/null\n\
         echo first-fg=$?\n\
         until [ -e {} ]; do sleep 0.05; done\n\
         fg %1 >/dev/null\n\
         echo ferrolock-status=$?\n",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started),
        p(&pid),
        p(&started),
        p(&go),
    );
    fs::write(dir.path().join("job.sh"), job).unwrap();
    let mut script = on_a_terminal("sh", &dir.path().join("job.sh"));
    let child = || fs::read_to_string(&started).unwrap_or_default();
    wait_for("COMMAND given the terminal by `fg`", || {
        let f = stat_fields(&child());
        f.len() > 5 && f[2] == f[5]
    });
    type_at(&mut script, b"\x1a");
    let ferrolock = fs::read_to_string(&pid).unwrap();
    wait_for("COMMAND and ferrolock stopped by Ctrl-Z", || {
        [child(), ferrolock.clone()]
            .iter()
            .all(|pid| stat_fields(pid).first().is_some_and(|s| s == "T"))
    });
    assert!(
        server.cmd::<Option<String>>(&["GET", "fg-stop"]).is_some(),
        "released while COMMAND was stopped"
    );
    // The script's second `fg` continues both, COMMAND with the terminal again.
    fs::write(&go, "").unwrap();
    wait_for("COMMAND given the terminal by the second `fg`", || {
        let f = stat_fields(&child());
        f.len() > 5 && f[0] != "T" && f[2] == f[5]
    });
    type_at(&mut script, b"\x03");
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("command-got-sigint") && out.contains("ferrolock-status=7"),
        "{out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "fg-stop"]).is_none(),
        "not released"
    );
}

/// Under a parent that never reaps its orphans (a container's PID 1 without an init, here a
/// child subreaper that only waits for ferrolock), what the child started ends as zombies
/// that keep its process group in existence: they are no longer running, so ferrolock exits
/// once the rest is gone instead of waiting out --grace (5 minutes here).
#[test]
fn zombies_left_in_the_group_do_not_hold_the_exit_until_the_grace_ends() {
    let server = RedisServer::start();
    let subreaper = r#"
import ctypes, os, subprocess, sys
if ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER
    sys.exit("prctl failed")
rc = subprocess.Popen(sys.argv[1:]).wait()  # reaps ferrolock only
zombies = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        continue
    zombies += fields[0] == "Z" and fields[1] == str(os.getpid())
print(f"rc={rc} zombies={zombies}", flush=True)
"#;
    let mut cmd = Command::new("python3");
    cmd.env_remove("FERROLOCK_NODES")
        .env_remove("FERROLOCK_HELD")
        .stdin(Stdio::null())
        .args(["-c", subreaper, env!("CARGO_BIN_EXE_ferrolock")])
        .args([
            "run",
            "--nodes",
            &server.url(),
            "--ttl",
            "1s",
            "--max-hold",
            "1s",
        ])
        .args([
            "--grace",
            "5m",
            "zombies",
            "--",
            "sh",
            "-c",
            "sleep 300 & sleep 300 & wait",
        ]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text} {err}");
    // The fault is real: the sleeps were left unreaped.
    let zombies: u32 = text
        .trim()
        .rsplit_once("zombies=")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("{text} {err}"));
    assert!(zombies >= 1, "no zombie was left: {text} {err}");
    assert!(text.contains("rc=70"), "{text} {err}");
}

/// `kill -TSTP` sent to ferrolock itself (not the terminal's Ctrl-Z, which reaches the
/// child's group): ferrolock stopped alone, and COMMAND ran on with its lock no longer
/// renewed. As a shell job, both stop, and a SIGCONT to ferrolock continues both.
#[test]
fn sigtstp_sent_to_ferrolock_stops_command_too_and_sigcont_continues_both() {
    use std::os::unix::process::CommandExt;
    let server = RedisServer::start();
    let dir = tmp();
    let (pidfile, go) = (dir.path().join("pid"), dir.path().join("go"));
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "--ttl",
        "30s",
        "tstp",
        "--",
    ])
    .args([
        "bash",
        "-c",
        &format!(
            "echo $$ > {}; while [ ! -e {} ]; do sleep 0.05; done; exit 7",
            p(&pidfile),
            p(&go)
        ),
    ])
    .process_group(0);
    let mut run = cmd.spawn().expect("spawn");
    wait_for("the child wrote its pid", || {
        fs::read_to_string(&pidfile).is_ok_and(|s| s.ends_with('\n'))
    });
    let pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let me = run.id() as i32;
    // SAFETY: our own unreaped child.
    unsafe { libc::kill(me, libc::SIGTSTP) };
    wait_for("ferrolock stopped", || state(me) == 'T');
    wait_for("COMMAND stopped with ferrolock", || state(pid) == 'T');
    // Stopped within the validity: the lock stays.
    assert!(server.cmd::<Option<String>>(&["GET", "tstp"]).is_some());
    // SAFETY: as above.
    unsafe { libc::kill(me, libc::SIGCONT) };
    wait_for("COMMAND continued with ferrolock", || state(pid) != 'T');
    fs::write(&go, "").unwrap();
    assert_eq!(wait(&mut run).code(), Some(7));
    assert!(
        server.cmd::<Option<String>>(&["GET", "tstp"]).is_none(),
        "not released"
    );
}

/// A SIGINT sent to ferrolock alone (`kill -INT`, not the terminal's Ctrl-C) while COMMAND
/// has the terminal: it is forwarded and COMMAND dies of it, but no SIGINT reached the group
/// that started ferrolock. ferrolock sent it one all the same, as for a Ctrl-C, and the
/// script that ran it (and the rest of its pipeline) died, where a `kill -INT` of COMMAND
/// itself leaves the script going on.
#[test]
fn a_sigint_sent_to_ferrolock_alone_does_not_reach_the_script_that_runs_it() {
    let server = RedisServer::start();
    let dir = tmp();
    let started = dir.path().join("started");
    let job = format!(
        // As above: COMMAND says it started once its group has the terminal.
        "{} run --nodes {} kill-int -- sh -c 'until set -- $(cat /proc/$$/stat) && [ $5 = $8 ]; do sleep 0.01; done; echo $$ > {}; exec sleep 20'; echo ferrolock-status=$?; echo the-script-went-on",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started)
    );
    fs::write(dir.path().join("job.sh"), job).unwrap();
    let mut script = on_a_terminal("bash", &dir.path().join("job.sh"));
    wait_for("COMMAND started with the terminal", || {
        fs::read_to_string(&started).is_ok_and(|s| s.ends_with('\n'))
    });
    let command = fs::read_to_string(&started).unwrap();
    let ferrolock: i32 = stat_fields(&command)[1].parse().unwrap();
    // SAFETY: plain syscall; ferrolock is COMMAND's parent, alive while COMMAND runs.
    unsafe { libc::kill(ferrolock, libc::SIGINT) };
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("ferrolock-status=130") && out.contains("the-script-went-on"),
        "the script did not go on after a SIGINT sent to ferrolock alone: {out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "kill-int"]).is_none(),
        "not released"
    );
}

/// Ctrl-Z while a shell script run as a job (`sh job.sh` from a shell with job control) runs
/// ferrolock: the terminal's SIGTSTP reached COMMAND's group alone, which has the terminal;
/// ferrolock stopped with it, but the script did not, so its shell never saw the job stopped
/// and never got the terminal back (without ferrolock the whole job stops). As for a Ctrl-C,
/// ferrolock passes the stop on to the group that started it.
#[test]
fn ctrl_z_in_a_script_that_runs_ferrolock_stops_the_script_too() {
    let server = RedisServer::start();
    let dir = tmp();
    let (started, back, go) = (
        dir.path().join("started"),
        dir.path().join("back"),
        dir.path().join("go"),
    );
    let inner = format!(
        // As above: COMMAND says it started once its group has the terminal.
        "{} run --nodes {} script-z -- bash -c 'until set -- $(cat /proc/$$/stat) && [ $5 = $8 ]; do sleep 0.01; done; touch {}; until [ -e {} ]; do sleep 0.05; done; exit 5'\n\
         echo ferrolock-status=$?\n",
        env!("CARGO_BIN_EXE_ferrolock"),
        server.url(),
        p(&started),
        p(&go),
    );
    fs::write(dir.path().join("inner.sh"), inner).unwrap();
    let outer = format!(
        "set -m\n\
         sh {}\n\
         touch {}\n\
         fg %1 >/dev/null\n\
         echo job-status=$?\n",
        p(&dir.path().join("inner.sh")),
        p(&back),
    );
    fs::write(dir.path().join("outer.sh"), outer).unwrap();
    let mut script = on_a_terminal("sh", &dir.path().join("outer.sh"));
    wait_for("COMMAND started with the terminal", || started.exists());
    type_at(&mut script, b"\x1a");
    wait_for("the shell got the job back as stopped after Ctrl-Z", || {
        back.exists()
    });
    assert!(
        server.cmd::<Option<String>>(&["GET", "script-z"]).is_some(),
        "released while COMMAND was stopped"
    );
    // The shell's `fg` continues the script, ferrolock and COMMAND.
    fs::write(&go, "").unwrap();
    let (_, out) = finish(&mut script);
    assert!(
        out.contains("ferrolock-status=5") && out.contains("job-status=0"),
        "{out}"
    );
    assert!(
        server.cmd::<Option<String>>(&["GET", "script-z"]).is_none(),
        "not released"
    );
}

/// `inspect` given a cluster node as a plain `redis://` URL (which reads that node's slots
/// only) for a key another primary serves says so in words, with the node that serves it and
/// the URL to use: it printed the raw redirect, "error: Moved: 11113 127.0.0.1:7002".
#[test]
fn inspect_on_a_plain_url_to_a_cluster_node_names_the_key_s_primary() {
    let cluster = RedisCluster::start();
    let key = "job:1";
    let owner = cluster.primary_for_key(key);
    owner.cmd::<()>(&[
        "SET",
        key,
        "0123456789abcdef0123456789abcdef",
        "PX",
        "60000",
    ]);
    let other = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != owner.port())
        .unwrap();
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &other.url(), key]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(69), "{text}");
    let slot = ferrolock_testbed::key_slot(key);
    assert!(
        text.contains(&format!(
            "slot {slot} is served by 127.0.0.1:{}, not this node",
            owner.port()
        )) && text.contains("redis+cluster://"),
        "{text}"
    );
    assert!(!text.contains("Moved"), "{text}");
}

/// `scan` while a slot is resharded, its lock already moved to the target: the target lists
/// the key (SCAN) but answers MOVED to a read of it without ASKING, which failed that primary
/// ("error: Moved: 1006 127.0.0.1:7001", exit 69) and hid the lock from every node.
#[test]
fn scan_on_a_cluster_lists_a_lock_whose_slot_is_being_migrated() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let key = "moving:lock".to_string();
    let source = cluster.primary_for_key(&key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let token = "0123456789abcdef0123456789abcdef";
    source.cmd::<()>(&["SET", &key, token, "PX", "60000"]);
    let staying = "{moving:lock}:stays";
    source.cmd::<()>(&["SET", staying, token, "PX", "60000"]);
    let slot = ferrolock_testbed::key_slot(&key).to_string();
    let id = |n: &RedisServer| -> String { n.cmd(&["CLUSTER", "MYID"]) };
    let ok: String = target.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(source)]);
    assert_eq!(ok, "OK");
    let ok: String = source.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(target)]);
    assert_eq!(ok, "OK");
    let port = target.port().to_string();
    let ok: String = source.cmd(&["MIGRATE", "127.0.0.1", &port, &key, "0", "5000"]);
    assert_eq!(ok, "OK", "the key moved to the target");

    // A key of the slot not moved yet, read on the importing primary named by a plain URL:
    // the source holds it, and the target must not call it free (its ASKING read would).
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &target.url(), staying]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("free"), "{text}");
    assert_eq!(out.status.code(), Some(69), "{text}");

    for json in [false, true] {
        let mut cmd = ferrolock();
        cmd.args(["scan", "--nodes", &url, "moving:*"]);
        if json {
            cmd.arg("--json");
        }
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(0), "{text}");
        if json {
            let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
            let locks = json["locks"].as_array().unwrap();
            assert_eq!(locks.len(), 1, "{json}");
            assert_eq!(locks[0]["key"], key.as_str());
            assert_eq!(
                locks[0]["node"],
                format!("{url} primary 127.0.0.1:{port}"),
                "listed where it is: {json}"
            );
        } else {
            assert!(
                text.contains("\"moving:lock\"  plain (redis-py, node-redlock)"),
                "{text}"
            );
        }
    }
}

/// `inspect` of a lock whose slot is being migrated (resharding) and whose key has already
/// moved to the target: the source answers `ASK`; inspect follows it (ASKING on the target)
/// and shows the holder, not a raw redirect error.
#[test]
fn inspect_on_a_cluster_follows_a_migrating_slots_ask() {
    let cluster = RedisCluster::start();
    let url = cluster.url();
    let key = "moving:lock".to_string();
    let source = cluster.primary_for_key(&key);
    let target = cluster
        .primaries()
        .iter()
        .find(|p| p.port() != source.port())
        .unwrap();
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let token = format!("{now_ms:012x}-{:020x}", 7);
    source.cmd::<()>(&["SET", &key, &token, "PX", "60000"]);
    let slot = ferrolock_testbed::key_slot(&key).to_string();
    let id = |n: &RedisServer| -> String { n.cmd(&["CLUSTER", "MYID"]) };
    let ok: String = target.cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &id(source)]);
    assert_eq!(ok, "OK");
    let ok: String = source.cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &id(target)]);
    assert_eq!(ok, "OK");
    let port = target.port().to_string();
    let ok: String = source.cmd(&["MIGRATE", "127.0.0.1", &port, &key, "0", "5000"]);
    assert_eq!(ok, "OK");

    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, &key]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{text}{err}");
    assert!(
        text.contains(&format!("holder token: {token}")),
        "{text}{err}"
    );
}

/// A long key (100 kB given to `inspect`, the most one argument takes; 1 MiB found by `scan`)
/// is named in the text by its start and its length, as the library names one, not repeated
/// whole: in `inspect`'s title, in the refusal of a key no primary serves, and in `scan`'s list.
#[test]
fn inspect_and_scan_name_a_long_key_by_its_start_and_length() {
    let server = RedisServer::start();
    let url = server.url();
    let key = "k".repeat(100_000);
    let token = format!("{:012x}-{:020x}", 1u64 << 40, 7);
    server.cmd::<()>(&["SET", &key, &token, "PX", "60000"]);
    let huge = "h".repeat(1 << 20);
    server.cmd::<()>(&["SET", &huge, &token, "PX", "60000"]);
    // Named, and nothing else is long.
    let short = |out: &Output, shown: &str| {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.len() < 2000 && text.contains(shown),
            "{} bytes: {text:.300}",
            text.len()
        );
    };
    let shown = format!("\"{}…\" (100000 bytes)", "k".repeat(64));
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &url, &key]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0));
    short(&out, &format!("lock {shown}\n"));
    let mut cmd = ferrolock();
    cmd.args(["scan", "--nodes", &url, "h*"]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(0));
    short(
        &out,
        &format!("  \"{}…\" (1048576 bytes)  plain", "h".repeat(64)),
    );

    // A cluster's seed that no longer serves the key's slot, nor knows who does.
    let cluster = RedisCluster::start();
    let owner = cluster.primary_for_key(&key);
    let slot = ferrolock::cluster_key_slot(&key).to_string();
    owner.cmd::<()>(&["CLUSTER", "DELSLOTS", &slot]);
    let seed = format!("redis+cluster://127.0.0.1:{}", owner.port());
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &seed, &key]);
    let out = output(cmd);
    assert_eq!(out.status.code(), Some(69));
    short(&out, &format!("no primary serves slot {slot} of {shown}\n"));
}

/// A value far longer than any lock's, under a name that looks like one (a 32 MiB string
/// starting with a ferrolock token, a hash of hold counts but one 4 MiB field): `scan` and
/// `inspect` read it whole (GET, HGETALL), slow and memory-hungry on a big one. They read
/// what they show: `inspect` the string's start and its length, and neither the hash's value.
/// The bytes the server sent tell what they read.
#[test]
fn inspect_and_scan_read_no_more_of_a_huge_value_than_they_show() {
    let server = RedisServer::start();
    let url = server.url();
    let token = format!("{:012x}-{:020x}", 1u64 << 40, 7);
    let size = 32 << 20;
    server.cmd::<()>(&["SET", "big:string", &token]);
    server.cmd::<()>(&["SETRANGE", "big:string", &(size - 1).to_string(), "x"]);
    assert_eq!(server.cmd::<u64>(&["STRLEN", "big:string"]), size);
    let owner = "0123456789abcdef0123456789abcdef";
    let value = "x".repeat(4 << 20);
    server.cmd::<()>(&["HSET", "big:hash", &format!("{owner}:1"), "1"]);
    server.cmd::<()>(&["HSET", "big:hash", &format!("{owner}:2"), &value]);
    let sent = || -> u64 {
        let info: String = server.cmd(&["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_net_output_bytes:"))
            .and_then(|n| n.trim().parse().ok())
            .expect("total_net_output_bytes")
    };
    let read = |args: &[&str]| {
        let before = sent();
        let mut cmd = ferrolock();
        cmd.args(args);
        let out = output(cmd);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(out.status.code(), Some(0), "{text:.300}");
        let read = sent() - before;
        assert!(read < 1 << 20, "{args:?} read {read} bytes");
        text
    };
    let text = read(&["scan", "--nodes", &url, "big:*"]);
    assert!(text.contains("0 lock(s)"), "{text:.300}");
    let text = read(&["inspect", "--nodes", &url, "big:string"]);
    assert!(
        text.len() < 2000 && text.contains(&format!("holder token: {token}")),
        "{} bytes: {text:.300}",
        text.len()
    );
    assert!(text.contains(&format!("… ({size} bytes)\n")), "{text:.300}");
    let text = read(&["inspect", "--json", "--nodes", &url, "big:string"]);
    let json: serde_json::Value = serde_json::from_str(&text).expect("inspect --json");
    let holder = &json["nodes"][0]["holder"];
    assert_eq!(holder["token_bytes"], size, "{holder}");
    assert!(
        holder["token"].as_str().unwrap().starts_with(&token),
        "{holder}"
    );
    let text = read(&["inspect", "--nodes", &url, "big:hash"]);
    assert!(text.contains("kind: not a lock"), "{text:.300}");
}

/// Two seeds of one cluster given as two nodes: `inspect` showed the lock twice, once per
/// seed, as two nodes' views of it. As `scan`, it now shows it once and names the second
/// URL as the same cluster as the first.
#[test]
fn inspect_of_two_seeds_of_one_cluster_shows_the_lock_once() {
    let cluster = RedisCluster::start();
    let key = "twice:inspected";
    let token = format!("{:012x}-{:020x}", 1u64 << 40, 3);
    cluster
        .primary_for_key(key)
        .cmd::<()>(&["SET", key, &token, "PX", "60000"]);
    let seed = |i: usize| format!("redis+cluster://127.0.0.1:{}", cluster.nodes[i].port());
    let nodes = format!("{},{}", seed(0), seed(1));
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--json", "--nodes", &nodes, key]);
    let out = output(cmd);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json");
    let held: Vec<_> = json["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["holder"]["token"] == token.as_str())
        .collect();
    assert_eq!(held.len(), 1, "{json}");
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &nodes, key]);
    let out = output(cmd);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(text.matches("holder token:").count(), 1, "{text}");
    assert!(
        text.contains(&format!("{}: the same cluster as {}", seed(1), seed(0))),
        "{text}"
    );
}
