//! `ferrolock run` end to end: the real binary against real redis-servers from the test bed.
//! Each test starts its own servers, so they run in parallel.

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ferrolock_testbed::{Cluster, RedisServer};

/// Far beyond anything these tests should take, so a hang fails instead of blocking the run.
const HANG: Duration = Duration::from_secs(20);

fn ferrolock() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferrolock"));
    // A developer's own setting must not point a test at their Redis.
    cmd.env_remove("FERROLOCK_NODES").stdin(Stdio::null());
    // The signals these tests send at their default action, as from a terminal's shell:
    // ferrolock leaves one it was started with ignored alone (as `nohup` asks), and a test
    // run as a background job of a script inherits SIGINT and SIGQUIT ignored.
    // SAFETY: signal() is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGHUP, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd
}

/// `ferrolock run --nodes URL ARGS...`, waited for, with output captured.
fn run(server: &RedisServer, args: &[&str]) -> Output {
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url()]).args(args);
    output_within(cmd, HANG)
}

fn output_within(mut cmd: Command, limit: Duration) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferrolock");
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || tx.send(child.wait_with_output()));
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("ferrolock did not exit within {limit:?}"))
        .expect("wait for ferrolock")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn wait_within(child: &mut Child, limit: Duration) -> ExitStatus {
    let end = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("ferrolock did not exit within {limit:?}");
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn wait_for_file(path: &Path) {
    let end = Instant::now() + HANG;
    while !path.exists() {
        assert!(Instant::now() < end, "{} never appeared", path.display());
        thread::sleep(Duration::from_millis(10));
    }
}

fn exists(server: &RedisServer, key: &str) -> bool {
    server.cmd::<i64>(&["EXISTS", key]) == 1
}

fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ferrolock-cli-")
        .tempdir()
        .expect("tempdir")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: plain syscall on our own child, which has not been reaped yet.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, sig) },
        0,
        "kill({sig})"
    );
}

#[test]
fn exit_code_of_the_child_is_passed_through() {
    let server = RedisServer::start();
    assert_eq!(
        run(&server, &["k", "--", "sh", "-c", "exit 7"])
            .status
            .code(),
        Some(7)
    );
    assert_eq!(run(&server, &["k", "--", "true"]).status.code(), Some(0));
    // Without `--` too: everything from COMMAND on belongs to the child, `-c` included.
    assert_eq!(
        run(&server, &["k", "sh", "-c", "exit 3"]).status.code(),
        Some(3)
    );
}

#[test]
fn child_killed_by_a_signal_exits_128_plus_signo() {
    let server = RedisServer::start();
    let out = run(&server, &["k", "--", "sh", "-c", "kill -KILL $$"]);
    assert_eq!(out.status.code(), Some(128 + 9), "{}", stderr(&out));
    assert!(
        !exists(&server, "k"),
        "lock not released after the child was killed"
    );
}

#[test]
fn child_sees_key_and_the_token_stored_in_redis() {
    let server = RedisServer::start();
    let dir = tmp();
    let file = dir.path().join("env");
    // Through FERROLOCK_NODES rather than --nodes, so the environment default is covered.
    let mut cmd = ferrolock();
    cmd.env("FERROLOCK_NODES", server.url()).args(["run", "jobs:nightly", "--", "sh", "-c"]).arg(format!(
        r#"printf '%s\n%s\n' "$FERROLOCK_KEY" "$FERROLOCK_TOKEN" > {f}; redis-cli -p {p} GET "$FERROLOCK_KEY" >> {f}"#,
        f = path_str(&file),
        p = server.port()
    ));
    let out = output_within(cmd, HANG);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = fs::read_to_string(&file).expect("child wrote its environment");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text:?}");
    assert_eq!(lines[0], "jobs:nightly");
    assert!(
        ferrolock::token_time(lines[1]).is_some(),
        "token {:?}",
        lines[1]
    );
    assert_eq!(
        lines[2], lines[1],
        "FERROLOCK_TOKEN differs from the value stored at the key"
    );
}

/// For the other kinds, FERROLOCK_TOKEN is what `inspect` shows for the hold, as the help
/// says: the owner's field of a reentrant (or read-write) lock's hash, a semaphore's permit
/// id in hex.
#[test]
fn child_token_of_a_hash_lock_or_a_semaphore_is_what_inspect_shows() {
    let server = RedisServer::start();
    let exe = env!("CARGO_BIN_EXE_ferrolock");
    for (flags, shows) in [
        (&["--reentrant", "r"][..], "owner "),
        (&["--write", "w"], "writer "),
        (&["--read", "rd"], "reader "),
        (&["--semaphore", "s", "--permits", "2"], "permit "),
    ] {
        let key = flags[1];
        let mut cmd = ferrolock();
        cmd.args(["run", "--nodes", &server.url()])
            .args(flags)
            .args(["--", "sh", "-c"])
            .arg(format!(
                r#"{exe} inspect --nodes {} {key} | grep -q "{shows}$FERROLOCK_TOKEN[: ]" || {{ echo "$FERROLOCK_TOKEN"; {exe} inspect --nodes {} {key}; exit 9; }}"#,
                server.url(),
                server.url()
            ));
        let out = output_within(cmd, HANG);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{flags:?}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
    }
}

#[test]
fn lock_is_released_when_the_child_exits() {
    let server = RedisServer::start();
    let dir = tmp();
    let seen = dir.path().join("seen");
    // The default 10 s ttl: a key gone right after exit was released, not expired.
    let script = format!(
        "redis-cli -p {} EXISTS k > {}",
        server.port(),
        path_str(&seen)
    );
    let out = run(&server, &["k", "--", "sh", "-c", &script]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(&seen).unwrap().trim(),
        "1",
        "the key was not held while the child ran"
    );
    assert!(
        !exists(&server, "k"),
        "lock still held after the child exited"
    );
}

#[test]
fn concurrent_runs_exclude_each_other() {
    let server = RedisServer::start();
    let dir = tmp();
    let counter = dir.path().join("counter");
    fs::write(&counter, "0").unwrap();
    // Read, pause, write: two children inside at once both read the same value and the
    // count comes out short.
    let script = r#"n=$(cat "$1"); sleep 0.2; echo $((n + 1)) > "$1""#;
    const RUNS: usize = 3;
    let children: Vec<Child> = (0..RUNS)
        .map(|_| {
            ferrolock()
                .args([
                    "run",
                    "--nodes",
                    &server.url(),
                    "counter",
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                ])
                .arg(&counter)
                .spawn()
                .expect("spawn ferrolock")
        })
        .collect();
    for mut child in children {
        assert!(wait_within(&mut child, HANG).success());
    }
    assert_eq!(
        fs::read_to_string(&counter).unwrap().trim(),
        RUNS.to_string()
    );
}

#[test]
fn wait_budget_spent_exits_75_without_running_the_child() {
    let server = RedisServer::start();
    server.cmd::<String>(&["SET", "busy", "someone-else", "PX", "10000"]);
    let dir = tmp();
    let ran = dir.path().join("ran");
    for wait in ["200ms", "0"] {
        let started = Instant::now();
        let out = run(
            &server,
            &["--wait", wait, "busy", "--", "touch", path_str(&ran)],
        );
        assert_eq!(
            out.status.code(),
            Some(75),
            "--wait {wait}: {}",
            stderr(&out)
        );
        assert!(stderr(&out).starts_with("ferrolock: "), "{}", stderr(&out));
        assert!(stderr(&out).contains("\"busy\""), "{}", stderr(&out));
        if wait == "200ms" {
            assert!(
                started.elapsed() >= Duration::from_millis(200),
                "gave up before --wait was spent"
            );
        }
        assert!(
            !ran.exists(),
            "the child ran although the lock was not acquired"
        );
    }
    assert_eq!(
        server.cmd::<String>(&["GET", "busy"]),
        "someone-else",
        "the other holder's lock was touched"
    );
}

#[test]
fn no_reachable_quorum_exits_69_in_bounded_time() {
    let dir = tmp();
    let ran = dir.path().join("ran");
    let touch = ["--", "touch", path_str(&ran)];

    let mut single = RedisServer::start();
    single.kill();
    // No --wait: "block until acquired" must still end when nothing answers.
    let started = Instant::now();
    let out = run(&single, &[&["k"], &touch[..]].concat());
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        stderr(&out).contains(&single.url()),
        "the dead node is not named: {}",
        stderr(&out)
    );

    // A majority dead is as good as all: the one live node cannot make a quorum alone, and
    // must not keep the minority grant. --ttl 1s keeps the live node's restart guard (ttl
    // long when N >= 3; it was just started) short, see the note in the report to core.
    let mut cluster = Cluster::start(3);
    cluster.servers[0].kill();
    cluster.servers[1].kill();
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &cluster.nodes_env(), "--ttl", "1s", "k"])
        .args(touch);
    let started = Instant::now();
    let out = output_within(cmd, HANG);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        !exists(&cluster.servers[2], "k"),
        "the lone live node kept a minority grant"
    );

    cluster.servers[2].kill();
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &cluster.nodes_env(), "k"])
        .args(touch);
    let started = Instant::now();
    let out = output_within(cmd, HANG);
    assert_eq!(out.status.code(), Some(69), "{}", stderr(&out));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(!ran.exists(), "the child ran without a quorum");
}

#[test]
fn bad_input_exits_64_and_names_the_value() {
    let dir = tmp();
    let ran = dir.path().join("ran");
    let touch = ["touch", path_str(&ran)];
    let nodes = ["--nodes", "redis://127.0.0.1:1"];
    let cases: &[(&[&str], &str)] = &[
        (&["--ttl", "0s", "k", "--"], "'0s'"),
        (&["--ttl", "abc", "k", "--"], "'abc'"),
        (&["--ttl", "10", "k", "--"], "'10'"),
        (&["--wait", "5", "k", "--"], "'5'"),
        (&["--wait", "-1s", "k", "--"], "'-1s'"),
        (&["--ttl", "1ms", "k", "--"], "1ms"),
        (&["--ttl", "50ms", "k", "--"], "ttl 50ms is too short"),
        // A node timeout the ttl cannot renew with: refused, not a child stopped at once.
        (
            &["--ttl", "1s", "--node-timeout", "5s", "k", "--"],
            "node timeout 5s",
        ),
        (&["--nodes", "http://x", "k", "--"], "http://x"),
        (&["--nodes", "", "k", "--"], "empty node URL"),
        (&["", "--"], "key must not be empty"),
        // A semaphore's is its name (it said "the lock key must not be empty").
        (
            &["--semaphore", "", "--permits", "2", "--"],
            "the semaphore name must not be empty",
        ),
        (&["--frobnicate", "k", "--"], "--frobnicate"),
        // Only too large: it says the range, not that it is no integer.
        (
            &["--max-extensions", "99999999999999999999999", "k", "--"],
            "at most 4294967295",
        ),
        (
            &["--max-extensions", "4294967296", "k", "--"],
            "at most 4294967295",
        ),
        (
            &["--max-extensions", "x", "k", "--"],
            "--max-extensions \"x\": not a non-negative integer",
        ),
        // The flag as typed: `--fence` (an alias) was named as `--fencing`, a flag the user
        // never wrote.
        (
            &["--semaphore", "s", "--permits", "2", "--fence", "--"],
            "'--fence'",
        ),
        (
            &["--fence", "--semaphore", "s", "--permits", "2", "--"],
            "'--fence'",
        ),
        (
            &["--semaphore", "s", "--permits", "2", "--fencing", "--"],
            "'--fencing'",
        ),
    ];
    for (args, needle) in cases {
        let mut cmd = ferrolock();
        cmd.arg("run");
        if !args.contains(&"--nodes") {
            cmd.args(nodes);
        }
        cmd.args(*args).args(touch);
        let out = output_within(cmd, HANG);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        assert!(err.starts_with("ferrolock: "), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle:?} not in {err}");
    }
    for (args, needle) in [
        (&["run", "k"][..], "<COMMAND>"),
        (&["run"][..], "<KEY>"),
        (&[][..], "Usage"),
    ] {
        let mut cmd = ferrolock();
        cmd.args(args);
        let out = output_within(cmd, HANG);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
    // Set but empty (`FERROLOCK_NODES=$REDIS_URL`, REDIS_URL unset) is not "unset": locking on
    // the local node instead would exclude no peer on the real servers. Not even a server
    // listening there is tried.
    for blank in ["", " "] {
        let mut cmd = ferrolock();
        cmd.env("FERROLOCK_NODES", blank)
            .args(["run", "k", "--"])
            .args(touch);
        let out = output_within(cmd, HANG);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{blank:?}: {err}");
        assert!(
            err.contains("FERROLOCK_NODES: set but empty") && err.contains("unset it"),
            "{blank:?}: {err}"
        );
    }
    // A CA file from FERROLOCK_TLS_CA is named as coming from there, not from FERROLOCK_NODES.
    let mut cmd = ferrolock();
    cmd.env("FERROLOCK_NODES", "rediss://127.0.0.1:1")
        .env("FERROLOCK_TLS_CA", "/nonexistent/ca.pem")
        .args(["run", "k", "--"])
        .args(touch);
    let out = output_within(cmd, HANG);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.starts_with("ferrolock: FERROLOCK_TLS_CA: cannot read tls_ca file /nonexistent/ca.pem"),
        "{err}"
    );
    // One that reads but holds no certificate too (it was blamed on FERROLOCK_NODES' node).
    let junk =
        std::env::temp_dir().join(format!("ferrolock-cli-junk-ca-{}.pem", std::process::id()));
    std::fs::write(
        &junk,
        "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let mut cmd = ferrolock();
    cmd.env("FERROLOCK_NODES", "rediss://127.0.0.1:1")
        .env("FERROLOCK_TLS_CA", &junk)
        .args(["run", "k", "--"])
        .args(touch);
    let out = output_within(cmd, HANG);
    std::fs::remove_file(&junk).unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.starts_with("ferrolock: FERROLOCK_TLS_CA: tls_ca file")
            && err.contains("not a PEM certificate file"),
        "{err}"
    );
    assert!(!ran.exists(), "a child ran despite bad input");
    // A key that is not UTF-8 is named, as `inspect` names it (it said only "the lock key
    // must be valid UTF-8").
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", "redis://127.0.0.1:1"])
        .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"bin\xffname"))
        .arg("--")
        .args(touch);
    let out = output_within(cmd, HANG);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains("the lock key \"bin\\xFFname\" is not UTF-8"),
        "{err}"
    );
    // And a semaphore's name (clap said "invalid UTF-8 was detected in one or more arguments").
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        "redis://127.0.0.1:1",
        "--permits",
        "1",
        "--semaphore",
    ])
    .arg(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(b"bin\xffname"))
    .arg("--")
    .args(touch);
    let out = output_within(cmd, HANG);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err}");
    assert!(
        err.contains(
            "the value of --semaphore <NAME> must be UTF-8 text, and \"bin\\xFFname\" is not"
        ),
        "{err}"
    );
    assert!(!ran.exists(), "a child ran despite bad input");
    let mut help = ferrolock();
    help.args(["run", "--help"]);
    assert_eq!(output_within(help, HANG).status.code(), Some(0));
}

/// The core's warnings reach stderr (they went nowhere: a run on restarted nodes waited
/// without a word), and `-q` silences them.
#[test]
fn the_cores_warnings_are_shown_unless_quiet() {
    let server = RedisServer::start();
    for quiet in [false, true] {
        let mut cmd = ferrolock();
        // The server is seconds old: under a guard of an hour its vote is held back, and with
        // no wait the run gives up at once.
        cmd.args([
            "run",
            "--nodes",
            &server.url(),
            "--restart-guard",
            "1h",
            "--wait",
            "0",
        ]);
        if quiet {
            cmd.arg("-q");
        }
        cmd.args(["guarded", "--", "true"]);
        let out = output_within(cmd, HANG);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(75), "{err}");
        let warned =
            err.contains("ferrolock: warning: restart guard: this node's vote does not count");
        assert_eq!(warned, !quiet, "quiet={quiet}: {err}");
        // Nobody holds the lock: the give-up says what is missing, not "held on 0 of 1", and
        // the time left to the millisecond.
        assert!(
            err.contains(
                "not acquired on the first try (wait=0): granted on 0 of 1 nodes (need 1); failed: "
            ),
            "{err}"
        );
        let left = err
            .split_once("its vote counts in ")
            .and_then(|(_, rest)| rest.split_once(')'))
            .map(|(left, _)| left)
            .unwrap_or_else(|| panic!("{err}"));
        let decimals = left.split_once('.').map_or(0, |(_, d)| {
            d.trim_end_matches(|c: char| c.is_alphabetic()).len()
        });
        assert!(decimals <= 3, "{left:?} in {err}");
    }
}

#[test]
fn command_not_found_is_127_and_not_executable_is_126_and_the_lock_is_released() {
    let server = RedisServer::start();
    let dir = tmp();
    let missing = dir.path().join("no-such-program");
    let out = run(&server, &["k", "--", path_str(&missing)]);
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
    assert!(stderr(&out).contains("no-such-program"), "{}", stderr(&out));
    // Exit 127 comes only after the acquire, so an absent key (ttl 10 s) means released.
    assert!(!exists(&server, "k"));

    let script = dir.path().join("not-executable.sh");
    fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    let out = run(&server, &["k", "--", path_str(&script)]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not-executable.sh"),
        "{}",
        stderr(&out)
    );
    assert!(!exists(&server, "k"));
}

/// Starts `ferrolock run` with a child that records `sig` into `<dir>/got` and exits 3, and
/// returns once the child is running under the lock.
fn start_trapping_child(server: &RedisServer, dir: &Path, sig: &str) -> (Child, PathBuf) {
    let got = dir.join("got");
    let started = dir.join("started");
    let script = format!(
        "trap 'echo {sig} > {got}; exit 3' {sig}; touch {started}; while :; do sleep 0.05; done",
        got = path_str(&got),
        started = path_str(&started)
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "k",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    // Its own process group, never a terminal's foreground job (where SIGINT is deliberately
    // not forwarded), even when the tests run in a terminal.
    cmd.process_group(0);
    let child = cmd.spawn().expect("spawn ferrolock");
    wait_for_file(&started);
    assert!(
        exists(server, "k"),
        "the child runs but the lock is not held"
    );
    (child, got)
}

#[test]
fn sigterm_is_forwarded_to_the_child_and_the_lock_released_after() {
    let server = RedisServer::start();
    let dir = tmp();
    let (mut child, got) = start_trapping_child(&server, dir.path(), "TERM");
    signal(&child, libc::SIGTERM);
    let status = wait_within(&mut child, HANG);
    // 3 is the child's trap: ferrolock outlived the signal and passed the child's status on.
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert_eq!(fs::read_to_string(&got).unwrap().trim(), "TERM");
    assert!(
        !exists(&server, "k"),
        "lock not released after the signalled child exited"
    );
}

#[test]
fn sigint_is_forwarded_when_not_a_terminal_job() {
    let server = RedisServer::start();
    let dir = tmp();
    let (mut child, got) = start_trapping_child(&server, dir.path(), "INT");
    signal(&child, libc::SIGINT);
    let status = wait_within(&mut child, HANG);
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert_eq!(fs::read_to_string(&got).unwrap().trim(), "INT");
    assert!(!exists(&server, "k"));
}

#[test]
fn signal_while_waiting_for_the_lock_stops_the_wait() {
    let server = RedisServer::start();
    server.cmd::<String>(&["SET", "busy", "someone-else", "PX", "10000"]);
    let dir = tmp();
    let ran = dir.path().join("ran");
    let mut child = ferrolock()
        .args([
            "run",
            "--nodes",
            &server.url(),
            "busy",
            "--",
            "touch",
            path_str(&ran),
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferrolock");
    // Its connection shows it is past installing the handlers and inside the acquire loop.
    let end = Instant::now() + HANG;
    while server.cmd::<String>(&["CLIENT", "LIST"]).lines().count() < 2 {
        assert!(Instant::now() < end, "ferrolock never connected");
        thread::sleep(Duration::from_millis(10));
    }
    signal(&child, libc::SIGTERM);
    let status = wait_within(&mut child, Duration::from_secs(5));
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status:?}");
    assert!(!ran.exists());
    assert_eq!(server.cmd::<String>(&["GET", "busy"]), "someone-else");
}

#[test]
fn validity_warning_is_printed_while_the_child_still_runs() {
    let server = RedisServer::start();
    let dir = tmp();
    let done = dir.path().join("done");
    // The warning is due about 300 ms in; the child runs for 4 s so that a loaded machine
    // still prints it while the child runs.
    let script = format!("sleep 4; touch {}", path_str(&done));
    let mut child = ferrolock()
        .args([
            "run",
            "--nodes",
            &server.url(),
            "--ttl",
            "300ms",
            "--no-watchdog",
            "short",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ferrolock");
    let stderr = BufReader::new(child.stderr.take().unwrap());
    let done_path = done.clone();
    // Each line paired with whether the child had finished when the line arrived.
    let reader = thread::spawn(move || {
        stderr
            .lines()
            .map(|l| (l.expect("read stderr"), done_path.exists()))
            .collect::<Vec<_>>()
    });
    let status = wait_within(&mut child, HANG);
    let lines = reader.join().unwrap();
    assert_eq!(status.code(), Some(0), "{lines:?}");
    assert!(done.exists(), "the child did not run to its end");
    let warnings: Vec<_> = lines
        .iter()
        .filter(|(l, _)| l.contains("validity ended"))
        .collect();
    assert_eq!(warnings.len(), 1, "{lines:?}");
    let (text, child_finished) = warnings[0];
    assert!(
        !child_finished,
        "the warning came only after the child had finished: {text}"
    );
    assert!(
        text.starts_with("ferrolock: warning: lock \"short\""),
        "{text}"
    );
    assert!(
        text.contains("sh") && text.contains("still running"),
        "{text}"
    );
}

/// `--read` holds the read side of a read-write lock: another `--read` runs beside it, a
/// `--write` is refused until it exits; a read ttl above 30 s is bad input naming it.
#[test]
fn read_runs_share_a_key_and_keep_writers_out() {
    let server = RedisServer::start();
    let dir = tmp();
    let (held, go) = (dir.path().join("held"), dir.path().join("go"));
    let script = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done",
        path_str(&held),
        path_str(&go)
    );
    let mut reader = ferrolock()
        .args([
            "run",
            "--nodes",
            &server.url(),
            "--read",
            "rw",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .spawn()
        .expect("spawn ferrolock");
    wait_for_file(&held);
    assert_eq!(server.cmd::<String>(&["HGET", "rw", "mode"]), "read");
    let other = run(&server, &["--read", "--wait", "0", "rw", "--", "true"]);
    assert_eq!(
        other.status.code(),
        Some(0),
        "a second reader: {}",
        stderr(&other)
    );
    let writer = run(&server, &["--write", "--wait", "0", "rw", "--", "true"]);
    assert_eq!(
        writer.status.code(),
        Some(75),
        "a writer beside a reader: {}",
        stderr(&writer)
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_within(&mut reader, HANG).success());
    let writer = run(&server, &["--write", "--wait", "0", "rw", "--", "true"]);
    assert_eq!(
        writer.status.code(),
        Some(0),
        "a writer after the reader: {}",
        stderr(&writer)
    );
    let long = run(&server, &["--read", "--ttl", "31s", "rw", "--", "true"]);
    assert_eq!(long.status.code(), Some(64), "{}", stderr(&long));
    assert!(stderr(&long).contains("31s"), "{}", stderr(&long));
}

/// `--semaphore NAME --permits N`: N + 1 concurrent runs, each recording when it starts and
/// ends in a shared file; at no point are more than N inside.
#[test]
fn semaphore_runs_never_exceed_the_permits() {
    let server = RedisServer::start();
    let dir = tmp();
    let log = dir.path().join("intervals");
    // One short appended line per event (O_APPEND: lines never interleave); nanoseconds of
    // the one machine's clock, read inside the hold.
    let script = r#"echo "s $(date +%s%N)" >> "$1"; sleep 0.3; echo "e $(date +%s%N)" >> "$1""#;
    const PERMITS: usize = 2;
    let children: Vec<Child> = (0..PERMITS + 1)
        .map(|_| {
            ferrolock()
                .args(["run", "--nodes", &server.url(), "--semaphore", "cron"])
                .args([
                    "--permits",
                    &PERMITS.to_string(),
                    "--",
                    "sh",
                    "-c",
                    script,
                    "sh",
                ])
                .arg(&log)
                .spawn()
                .expect("spawn ferrolock")
        })
        .collect();
    for mut child in children {
        assert!(wait_within(&mut child, HANG).success());
    }
    let text = fs::read_to_string(&log).unwrap();
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .map(|l| {
            let (kind, at) = l.split_once(' ').expect("an event line");
            // An end sorts before a start at the same instant: it was written first.
            (
                at.parse().expect("a time"),
                if kind == "s" { 1 } else { -1 },
            )
        })
        .collect();
    assert_eq!(events.len(), 2 * (PERMITS + 1), "{text}");
    events.sort();
    let (mut inside, mut most) = (0, 0);
    for (_, step) in events {
        inside += step;
        most = most.max(inside);
    }
    assert!(
        most <= PERMITS as i32,
        "{most} runs at once, permits {PERMITS}: {text}"
    );
}

/// A runner SIGKILLed while it holds the only permit leaves it taken (its id stays in the
/// timeout zset: nothing released it); the next run gets it once its lease ends.
#[test]
fn killed_semaphore_runner_permit_returns() {
    let server = RedisServer::start();
    let dir = tmp();
    let held = dir.path().join("held");
    // `exec`: the sleep is the child, which dies with the runner (a sleep under `sh` would
    // outlive it for 10 minutes, holding the test's output pipe open).
    let script = format!("touch {}; exec sleep 600", path_str(&held));
    let mut runner = ferrolock()
        .args(["run", "--nodes", &server.url(), "--semaphore", "one"])
        .args(["--permits", "1", "--ttl", "2s", "--", "sh", "-c", &script])
        .spawn()
        .expect("spawn ferrolock");
    wait_for_file(&held);
    signal(&runner, libc::SIGKILL);
    let status = wait_within(&mut runner, HANG);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    // Reclaim is lazy (inside the next acquire), so the killed holder's id is still there.
    assert_eq!(server.cmd::<i64>(&["ZCARD", "{one}:timeout"]), 1);
    let next = output_within(
        {
            let mut cmd = ferrolock();
            cmd.args(["run", "--nodes", &server.url(), "--semaphore", "one"])
                .args(["--permits", "1", "--wait", "60s", "--", "true"]);
            cmd
        },
        Duration::from_secs(90),
    );
    assert_eq!(next.status.code(), Some(0), "{}", stderr(&next));
}

/// Semaphore flags misused are usage errors (64) naming the flag or value.
#[test]
fn semaphore_bad_usage_exits_64() {
    let server = RedisServer::start();
    for (args, needle) in [
        (&["--permits", "2", "k", "--", "true"][..], "--semaphore"),
        (&["--semaphore", "s", "--", "true"][..], "--permits"),
        (
            &[
                "--semaphore",
                "s",
                "--permits",
                "2",
                "--count",
                "3",
                "--",
                "true",
            ][..],
            "count 3",
        ),
        (
            &["--semaphore", "s", "--permits", "x", "--", "true"][..],
            "'x'",
        ),
        // A negative number is the flag's bad value, not an unknown flag `-1`.
        (
            &["--semaphore", "s", "--permits", "-1", "--", "true"][..],
            "'-1' for '--permits <N>': must be at least 1",
        ),
        (
            &["--semaphore", "s", "--permits", "0", "--", "true"][..],
            "'0' for '--permits <N>': must be at least 1",
        ),
        (
            &["--semaphore", "s", "--permits", "4294967296", "--", "true"][..],
            "must be at most 4294967295",
        ),
        // Past what any integer type holds: still out of range, not "not a whole number".
        (
            &[
                "--semaphore",
                "s",
                "--permits",
                &"9".repeat(60),
                "--",
                "true",
            ][..],
            "must be at most 4294967295",
        ),
        (
            &[
                "--semaphore",
                "s",
                "--permits",
                "2",
                "--count",
                "-1",
                "--",
                "true",
            ][..],
            "'-1' for '--count <K>': must be at least 1",
        ),
        (
            &["--semaphore", "s", "--permits", "2", "--read", "--", "true"][..],
            "--read",
        ),
        (
            &["--semaphore", "s{x}", "--permits", "2", "--", "true"][..],
            "s{x}",
        ),
        (&["--semaphore", "s", "--permits", "2"][..], "COMMAND"),
        // A KEY beside --semaphore was run as the command, after the permit was taken.
        (
            &["--semaphore", "s", "--permits", "2", "k", "--", "true"][..],
            "\"k\" before `--`: --semaphore NAME takes no KEY",
        ),
    ] {
        let out = run(&server, args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{args:?}: {}", stderr(&out));
    }
}

/// On a usage error, clap's usage names each mode's own arguments: KEY for a lock (plain, or
/// a read-write lock's side), NAME and no KEY for a semaphore, whatever flag was misused.
#[test]
fn usage_shows_each_modes_own_arguments() {
    let server = RedisServer::start();
    for args in [
        &["--permits", "2", "k", "--", "true"][..],
        &["--semaphore", "s", "--", "true"][..],
        &["--read", "--write", "k", "--", "true"][..],
    ] {
        let out = run(&server, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {err}");
        let usage: Vec<&str> = err
            .lines()
            .skip_while(|l| !l.starts_with("Usage: "))
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(
            usage
                .iter()
                .any(|l| l.contains("<KEY> [--] <COMMAND>...") && !l.contains("--semaphore")),
            "{args:?}: no lock usage: {err}"
        );
        assert!(
            usage
                .iter()
                .any(|l| l.contains("--semaphore <NAME> --permits <N>")
                    && l.contains("[--] <COMMAND>...")
                    && !l.contains("<KEY>")),
            "{args:?}: no semaphore usage without KEY: {err}"
        );
    }
}

/// What `run` says names what it holds: a semaphore, a read or write lock, or a lock.
#[test]
fn messages_name_the_kind_held() {
    let server = RedisServer::start();
    for (args, what) in [
        (
            &["--semaphore", "s", "--permits", "2"][..],
            "semaphore \"s\"",
        ),
        (&["--read", "r"][..], "read lock \"r\""),
        (&["--write", "w"][..], "write lock \"w\""),
        (&["p"][..], "lock \"p\""),
    ] {
        let mut all = vec!["--verbose"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--", "true"]);
        let out = run(&server, &all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            err.contains(&format!("ferrolock: acquired {what} "))
                && err.contains(&format!("ferrolock: released {what}\n")),
            "{args:?}: {err}"
        );
    }
}

/// A pipe whose reader has already gone: every write to it fails with EPIPE (ferrolock, as
/// every Rust program, ignores SIGPIPE).
fn broken_pipe() -> Stdio {
    use std::os::fd::{FromRawFd, OwnedFd};
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills both descriptors on success; each is owned once below.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: fresh descriptors from pipe2, owned by nobody else.
    let (reader, writer) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(reader);
    Stdio::from(writer)
}

/// `ferrolock run -v ... 2>&1 | true`: stderr is a pipe nobody reads. The messages are lost,
/// but COMMAND runs under the lock, its status is passed on and the lock is released (an
/// `eprintln!` panicked here: exit 101, COMMAND never ran, the key held for its whole ttl).
#[test]
fn a_stderr_nobody_reads_does_not_stop_the_run() {
    let server = RedisServer::start();
    let dir = tmp();
    let seen = dir.path().join("seen");
    let script = format!(
        "redis-cli -p {} EXISTS ep > {}; exit 3",
        server.port(),
        path_str(&seen)
    );
    let mut cmd = ferrolock();
    cmd.args([
        "run",
        "--nodes",
        &server.url(),
        "-v",
        "--stats",
        "--ttl",
        "30s",
    ])
    .args(["ep", "--", "sh", "-c", &script])
    .stdout(Stdio::null())
    .stderr(broken_pipe());
    let mut child = cmd.spawn().expect("spawn ferrolock");
    let status = wait_within(&mut child, HANG);
    assert_eq!(status.code(), Some(3), "{status:?}");
    assert_eq!(
        fs::read_to_string(&seen).expect("COMMAND ran").trim(),
        "1",
        "COMMAND ran without the lock"
    );
    assert!(!exists(&server, "ep"), "the lock was not released");
}

/// `ferrolock scan | head -1` and `inspect` into a pipe whose reader has gone: ended quietly
/// with the status of a tool killed by SIGPIPE, not a panic (101).
#[test]
fn inspect_and_scan_end_quietly_on_a_closed_stdout_pipe() {
    let server = RedisServer::start();
    server.cmd::<String>(&[
        "SET",
        "held",
        "0123456789abcdef0123456789abcdef",
        "PX",
        "60000",
    ]);
    for args in [
        &["scan"][..],
        &["scan", "--json"],
        &["inspect", "held"],
        &["inspect", "--json", "held"],
    ] {
        let mut cmd = ferrolock();
        cmd.args(&args[..1])
            .args(["--nodes", &server.url()])
            .args(&args[1..])
            .stdout(broken_pipe())
            .stderr(Stdio::piped());
        let child = cmd.spawn().expect("spawn ferrolock");
        let out = child.wait_with_output().expect("wait for ferrolock");
        assert_eq!(
            out.status.code(),
            Some(128 + libc::SIGPIPE),
            "{args:?}: {}",
            stderr(&out)
        );
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

/// `inspect` and `scan` on a node that accepts connections but never answers (paused): "no
/// reply", exit 69, not the socket's "Resource temporarily unavailable" (or a hang).
#[test]
fn inspect_and_scan_name_a_silent_node_as_not_replying() {
    let server = RedisServer::start();
    server.pause();
    assert!(server.is_paused(), "the fault is in place");
    for args in [&["scan"][..], &["inspect", "held"]] {
        let out = ferrolock()
            .args(&args[..1])
            .args(["--nodes", &server.url()])
            .args(&args[1..])
            .output()
            .expect("run ferrolock");
        // Each node's line of the report (stdout) says what it answered, an error included.
        let err = format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr(&out));
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err}");
        assert!(err.contains("no reply within 2s"), "{args:?}: {err}");
        assert!(!err.contains("temporarily unavailable"), "{args:?}: {err}");
    }
    server.resume();
}

/// A lock taken over while COMMAND ran, with no renewal due before COMMAND ends (ttl 30 s):
/// only the release finds it gone. ferrolock exits 70, not COMMAND's 0, and says so; the
/// new holder's key is left alone. The same with --no-watchdog, before its validity ends.
#[test]
fn a_loss_found_only_at_release_exits_70() {
    let server = RedisServer::start();
    for flags in [&[][..], &["--no-watchdog"]] {
        let dir = tmp();
        let (started, go) = (dir.path().join("started"), dir.path().join("go"));
        let script = format!(
            "touch {}; while [ ! -e {} ]; do sleep 0.05; done; exit 0",
            path_str(&started),
            path_str(&go)
        );
        let child = ferrolock()
            .args(["run", "--nodes", &server.url(), "--ttl", "30s"])
            .args(flags)
            .args(["racek", "--", "sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ferrolock");
        wait_for_file(&started);
        server.cmd::<String>(&["SET", "racek", "stolen"]);
        fs::write(&go, "").unwrap();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || tx.send(child.wait_with_output()));
        let out = rx.recv_timeout(HANG).expect("ferrolock exits").unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(70), "{flags:?}: {err}");
        assert!(
            err.contains("ferrolock: lock \"racek\" was lost before sh finished"),
            "{flags:?}: {err}"
        );
        assert_eq!(
            server.cmd::<String>(&["GET", "racek"]),
            "stolen",
            "{flags:?}"
        );
        server.cmd::<i64>(&["DEL", "racek"]);
    }
}

/// With --semaphore there is no KEY: COMMAND's first word is not checked as one. An empty
/// program name is a COMMAND not found (127, as for a lock), not "the lock key must not be
/// empty" (64).
#[test]
fn semaphore_command_first_word_is_not_read_as_a_key() {
    let server = RedisServer::start();
    let out = run(&server, &["--semaphore", "s", "--permits", "2", "--", ""]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(err.starts_with("ferrolock: cannot run \"\""), "{err}");
    assert!(!err.contains("key"), "{err}");
    assert_eq!(
        server.cmd::<i64>(&["ZCARD", "{s}:timeout"]),
        0,
        "permit not released"
    );
}

/// The help of `-v` promises what a `-v` run prints: the acquire and the release, not the
/// renewals (it said "acquired, renewed, released", and no renewal was ever reported). The
/// run lasts past two renewals (every ttl/3).
#[test]
fn verbose_reports_what_its_help_says() {
    let mut help = ferrolock();
    help.args(["run", "--help"]);
    let help = String::from_utf8_lossy(&output_within(help, HANG).stdout).into_owned();
    let verbose = help
        .split("-v, --verbose")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("-v in the help")
        .to_string();
    assert!(
        verbose.contains("acquired") && verbose.contains("released"),
        "{verbose}"
    );
    assert!(
        !verbose.contains("renewed") && verbose.contains("renewals are not reported"),
        "{verbose}"
    );

    let server = RedisServer::start();
    let out = run(&server, &["-v", "--ttl", "3s", "k", "--", "sleep", "2.5"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.starts_with("ferrolock: acquired lock \"k\" "), "{err}");
    // Whole milliseconds ("2.987s"), not a clock's nanoseconds.
    let validity = err
        .split_once("(validity ")
        .and_then(|(_, v)| v.split_once('s'))
        .map(|(v, _)| v)
        .unwrap_or_else(|| panic!("no validity: {err}"));
    let decimals = validity.split_once('.').map_or(0, |(_, d)| d.len());
    assert!(decimals <= 3, "validity {validity}s: {err}");
    assert!(err.ends_with("ferrolock: released lock \"k\"\n"), "{err}");
    assert_eq!(err.lines().count(), 2, "{err}");
}

/// `inspect` and `scan` on a TLS node whose certificate a private CA signed: trusted with
/// `--tls-ca` or `FERROLOCK_TLS_CA`, as `run` is; without either, the system's roots refuse it
/// (exit 69, the node named).
#[test]
fn inspect_and_scan_trust_the_tls_ca_as_run_does() {
    let tls = ferrolock_testbed::TlsFiles::generate();
    let server = RedisServer::start_with(ferrolock_testbed::ServerOptions {
        tls: Some(tls.clone()),
        ..Default::default()
    });
    server.cmd::<String>(&[
        "SET",
        "tls:held",
        "0123456789abcdef0123456789abcdef",
        "PX",
        "60000",
    ]);
    let ca = tls.ca_cert.to_str().unwrap().to_string();
    for (args, ca_env) in [
        (vec!["inspect", "--tls-ca", &ca, "tls:held"], None),
        (vec!["scan", "--tls-ca", &ca, "tls:*"], None),
        (vec!["inspect", "tls:held"], Some(&ca)),
        (vec!["scan", "tls:*"], Some(&ca)),
    ] {
        let mut cmd = ferrolock();
        cmd.args(&args[..1])
            .args(["--nodes", &server.url()])
            .args(&args[1..]);
        if let Some(ca) = ca_env {
            cmd.env("FERROLOCK_TLS_CA", ca);
        }
        let out = output_within(cmd, HANG);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {text} {}",
            stderr(&out)
        );
        assert!(
            text.contains("tls:held") || text.contains("0123456789abcdef"),
            "{args:?}: {text}"
        );
    }
    let mut cmd = ferrolock();
    cmd.args(["inspect", "--nodes", &server.url(), "tls:held"])
        .env_remove("FERROLOCK_TLS_CA");
    let out = output_within(cmd, HANG);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(69), "{text}");
    assert!(text.contains(&server.url()), "{text}");
}

/// A key near the longest one argument can be (Linux takes 128 KiB) is named in run's own
/// lines by its start and its length, as the library's messages name it, not repeated whole.
#[test]
fn a_long_key_is_named_by_its_start_and_length() {
    let server = RedisServer::start();
    let key = "k".repeat(100_000);
    let shown = format!("\"{}…\" (100000 bytes)", "k".repeat(64));
    // --semaphore takes no KEY: the refusal names the word it took for one.
    let extra = ["--semaphore", "s", "--permits", "2", &key, "--", "true"];
    for (args, exit) in [(&["-v", &key, "--", "true"][..], 0), (&extra[..], 64)] {
        let out = run(&server, args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(exit), "{:.300}", err);
        assert!(!err.is_empty(), "{}: said nothing", args[0]);
        for line in err.lines() {
            assert!(
                line.len() < 1000 && line.contains(&shown),
                "{} bytes: {line:.300}",
                line.len()
            );
        }
    }
    // One that is not UTF-8 (as --semaphore's NAME: `a_value_that_is_not_utf8_is_refused_naming_its_option`).
    let mut bytes = key.into_bytes();
    bytes[99_999] = 0xff;
    let raw = <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&bytes);
    let start = format!("\"{}…\" (", "k".repeat(64));
    let mut cmd = ferrolock();
    cmd.args(["run", "--nodes", &server.url()])
        .arg(raw)
        .args(["--", "true"]);
    let out = output_within(cmd, HANG);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(64), "{err:.300}");
    assert!(
        err.len() < 1000 && err.contains(&start) && err.contains("is not UTF-8"),
        "{} bytes: {err:.300}",
        err.len()
    );
}

/// An option's value that is not UTF-8 is refused naming the option and what it must be:
/// clap said "invalid UTF-8 was detected in one or more arguments" for most (naming none), and
/// for --semaphore's NAME repeated the value whole (a 100 kB one filled the terminal).
#[test]
fn a_value_that_is_not_utf8_is_refused_naming_its_option() {
    use std::os::unix::ffi::OsStrExt;
    let bad = |bytes: &[u8]| std::ffi::OsStr::from_bytes(bytes).to_os_string();
    let mut long = vec![b'n'; 100_000];
    long[99_999] = 0xff;
    let mut ttl = b"--ttl=".to_vec();
    ttl.extend_from_slice(b"1\xffs");
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            ["run", "--permits", "2", "--semaphore"]
                .map(Into::into)
                .into_iter()
                .chain([bad(&long), "--".into(), "true".into()])
                .collect(),
            "--semaphore <NAME>",
        ),
        (
            vec![
                "inspect".into(),
                "--nodes".into(),
                bad(b"redis://\xff"),
                "k".into(),
            ],
            "--nodes <URLS>",
        ),
        (
            vec!["scan".into(), "--long".into(), bad(b"1\xffh")],
            "--long <DURATION>",
        ),
        (
            vec![
                "run".into(),
                bad(&ttl),
                "k".into(),
                "--".into(),
                "true".into(),
            ],
            "--ttl <DURATION>",
        ),
    ];
    for (args, option) in cases {
        let mut cmd = ferrolock();
        cmd.args(&args);
        let out = output_within(cmd, HANG);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{option}: {err:.300}");
        assert!(
            err.len() < 1000
                && err.starts_with(&format!(
                    "ferrolock: the value of {option} must be UTF-8 text, and "
                ))
                && err.contains(" is not"),
            "{option}: {} bytes: {err:.300}",
            err.len()
        );
    }
}
