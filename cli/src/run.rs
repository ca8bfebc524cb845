//! `ferrolock run`: acquire, run the child, release, and pass the child's status on.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;
use std::time::Duration;

use ferrolock::{Error, ErrorKind, Lock, LockManager, LockOptions, ManagerOptions};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use crate::exit;

const AFTER_HELP: &str = "\
Durations are a number and a unit: 500ms, 10s, 1.5s, 2m, 1h. A bare number is refused
(seconds or milliseconds?), except 0 for --wait.

The child sees FERROLOCK_KEY (the key) and FERROLOCK_TOKEN (the random value stored at the
key while it holds the lock).

No renewal: the lock lasts --ttl (minus a clock-drift allowance of 1% + 2ms) from the
moment it was acquired. If COMMAND is still running when that validity ends, ferrolock
prints a warning on stderr at that moment: another process may then acquire the lock while
COMMAND keeps running. Pick a --ttl comfortably longer than COMMAND can take.

Signals: SIGINT and SIGTERM sent to ferrolock are forwarded to COMMAND; ferrolock keeps
running until COMMAND exits and then releases the lock. COMMAND stays in ferrolock's
process group, so Ctrl-C in a terminal already reaches COMMAND directly; while ferrolock is
the terminal's foreground job it therefore does not forward SIGINT (a second SIGINT makes
many programs abandon their cleanup). To interrupt such a job from elsewhere, send SIGTERM.
A signal that arrives while ferrolock is still waiting for the lock ends the wait, and
COMMAND never runs.

Exit status:
  COMMAND's exit status, or 128+N when COMMAND was killed by signal N
  64      bad usage or bad input (the message names the bad value)
  69      no quorum of nodes reachable, or Redis refused the commands
  75      the lock was not acquired within --wait
  126     COMMAND could not be executed (the lock is released)
  127     COMMAND was not found (the lock is released)
  128+N   ferrolock got signal N while still waiting for the lock
COMMAND's own status can collide with these (a COMMAND that exits 75 looks like a timeout);
when ferrolock itself fails it always prints a \"ferrolock: ...\" line on stderr.";

#[derive(clap::Args)]
#[command(after_long_help = AFTER_HELP)]
pub struct RunArgs {
    /// Comma-separated node URLs (redis://, rediss://, unix://); more than one means Redlock,
    /// held on a majority [default: $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    // Not clap's `env`: the core resolves FERROLOCK_NODES itself (an empty value means unset
    // there), and clap would print the variable's value, passwords included, in --help.
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,

    /// Lease on each node; not renewed while COMMAND runs [default: 10s]
    // Hyphen values reach our parser, so `--ttl -1s` is named as a bad duration rather than
    // reported as an unknown flag `-1`.
    #[arg(long, value_name = "DURATION", value_parser = parse_ttl, allow_hyphen_values = true)]
    ttl: Option<Duration>,

    /// Give up after this long if the lock is held elsewhere; 0 tries once
    /// [default: wait until acquired]
    #[arg(long, value_name = "DURATION", value_parser = parse_wait, allow_hyphen_values = true)]
    wait: Option<Duration>,

    /// The lock's name: the Redis key that holds it
    #[arg(value_parser = parse_key)]
    key: String,

    /// The program to run under the lock, and its arguments (put `--` before it so that its
    /// options are not read as ferrolock's)
    #[arg(
        value_name = "COMMAND",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

fn parse_ttl(text: &str) -> Result<Duration, Error> {
    let d = ferrolock::parse_duration(text)?;
    if d.is_zero() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "the ttl must be greater than zero",
        ));
    }
    Ok(d)
}

/// A bare `0` is the one number without a unit that cannot be misread.
fn parse_wait(text: &str) -> Result<Duration, Error> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    ferrolock::parse_duration(text)
}

fn parse_key(text: &str) -> Result<String, &'static str> {
    if text.is_empty() {
        return Err("the lock key must not be empty");
    }
    Ok(text.to_string())
}

pub fn main(args: RunArgs) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return fail(
                exit::SOFTWARE,
                format_args!("cannot start the async runtime: {e}"),
            );
        }
    };
    runtime.block_on(run(args))
}

fn fail(code: u8, message: std::fmt::Arguments<'_>) -> u8 {
    eprintln!("ferrolock: {message}");
    code
}

fn fail_with(e: &Error) -> u8 {
    let code = match e.kind() {
        ErrorKind::InvalidArgument => exit::USAGE,
        ErrorKind::NotAcquired => exit::TEMPFAIL,
        ErrorKind::QuorumUnreachable | ErrorKind::Redis => exit::UNAVAILABLE,
        _ => exit::SOFTWARE,
    };
    fail(code, format_args!("{e} [{}]", e.kind().code()))
}

struct Signals {
    int: Signal,
    term: Signal,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        Ok(Signals {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
        })
    }

    /// The next SIGINT or SIGTERM. tokio keeps delivering after a `recv` completes, so this can
    /// be called again and again (a second Ctrl-C is forwarded too).
    async fn next(&mut self) -> libc::c_int {
        tokio::select! {
            _ = self.int.recv() => libc::SIGINT,
            _ = self.term.recv() => libc::SIGTERM,
        }
    }
}

async fn run(args: RunArgs) -> u8 {
    let mut opts = LockOptions::default().wait(args.wait).watchdog(false);
    if let Some(ttl) = args.ttl {
        opts = opts.ttl(ttl);
    }
    let nodes = args
        .nodes
        .as_deref()
        .map(ferrolock::split_nodes)
        .unwrap_or_default();
    // Built inside the runtime, so the manager spawns its background work (a release
    // whose caller went away) on this runtime rather than starting one of its own.
    let manager = match LockManager::new(ManagerOptions::new().nodes(nodes).lock(opts.clone())) {
        Ok(m) => m,
        Err(e) => return fail_with(&e),
    };
    // Before acquiring: a Ctrl-C during a long wait must not kill us by the default action,
    // which would skip the cleanup of a half-taken Redlock.
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            return fail(
                exit::SOFTWARE,
                format_args!("cannot install signal handlers: {e}"),
            );
        }
    };

    let acquired = tokio::select! {
        r = manager.acquire_with(&args.key, &opts) => Ok(r),
        sig = signals.next() => Err(sig),
    };
    let lock = match acquired {
        Ok(Ok(lock)) => lock,
        Ok(Err(e)) => return fail_with(&e),
        Err(sig) => {
            // The dropped acquire hands its partial grants to a background release on this
            // runtime; returning at once would drop the runtime with that release unfinished.
            tokio::time::sleep(opts.effective_node_timeout() + Duration::from_millis(50)).await;
            return fail(
                128 + sig as u8,
                format_args!(
                    "interrupted by {} while waiting for lock {:?}",
                    signal_name(sig),
                    args.key
                ),
            );
        }
    };

    let code = supervise(&args, &lock, &mut signals).await;
    match lock.release().await {
        Ok(true) => {}
        // The validity warning (if it fired) already said so; this covers a key deleted or
        // overwritten behind our back before the deadline.
        Ok(false) if Instant::now() >= lock.deadline() => {}
        Ok(false) => eprintln!(
            "ferrolock: warning: lock {:?} was no longer ours at release: it was deleted or taken over while {} ran",
            args.key,
            program(&args)
        ),
        Err(e) => eprintln!("ferrolock: warning: {e} [{}]", e.kind().code()),
    }
    code
}

/// Runs the child to completion while forwarding signals and watching the deadline. Returns
/// the exit code to pass on.
async fn supervise(args: &RunArgs, lock: &Lock, signals: &mut Signals) -> u8 {
    let mut child = match tokio::process::Command::new(&args.command[0])
        .args(&args.command[1..])
        .env("FERROLOCK_KEY", &args.key)
        .env("FERROLOCK_TOKEN", lock.token())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return fail(code, format_args!("cannot run {}: {e}", program(args)));
        }
    };
    // Taken now: once `wait` has reaped the child the pid may be reused, and we never signal
    // after that (the loop ends with the reap).
    let pid = child.id().map(|p| p as libc::pid_t);
    let deadline = lock.deadline();
    let mut warned = false;
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            sig = signals.next() => forward(sig, pid),
            _ = tokio::time::sleep_until(deadline), if !warned => {
                warned = true;
                eprintln!(
                    "ferrolock: warning: lock {:?} validity ended while {} (pid {}) is still running; another process may now hold it (--ttl {:?}, no renewal)",
                    args.key,
                    program(args),
                    pid.unwrap_or(0),
                    lock.options().ttl,
                );
            }
        }
    };
    match status {
        Ok(status) => exit_code(status),
        Err(e) => fail(
            exit::SOFTWARE,
            format_args!("lost track of {}: {e}", program(args)),
        ),
    }
}

fn forward(sig: libc::c_int, pid: Option<libc::pid_t>) {
    if sig == libc::SIGINT && foreground_of_terminal() {
        return;
    }
    if let Some(pid) = pid {
        // SAFETY: plain syscall on our own unreaped child, so the pid cannot have been reused.
        unsafe { libc::kill(pid, sig) };
    }
}

/// True when our process group is the foreground job of our controlling terminal: then a
/// terminal-generated SIGINT went to the whole group, the child included. A SIGINT sent with
/// kill(1) to such a job is not forwarded either; nothing in the signal tells them apart.
fn foreground_of_terminal() -> bool {
    // SAFETY: open/tcgetpgrp/close on a descriptor we own; getpgrp cannot fail.
    unsafe {
        let fd = libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let foreground = libc::tcgetpgrp(fd);
        libc::close(fd);
        foreground == libc::getpgrp()
    }
}

fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(sig)) => 128u8.saturating_add(sig as u8),
        (None, None) => exit::SOFTWARE,
    }
}

fn program(args: &RunArgs) -> String {
    args.command[0].to_string_lossy().into_owned()
}

fn signal_name(sig: libc::c_int) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        _ => "a signal",
    }
}
