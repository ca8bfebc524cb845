//! `ferrolock run`: acquire, run the child, release, and pass the child's status on.

use std::ffi::OsString;
use std::io;
use std::process::ExitStatus;

use crate::child;
use std::time::Duration;

use ferrolock::{Error, ErrorKind, Lock, LockManager, LockStatus, ManagerOptions};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::time::Instant;

use crate::exit;

const AFTER_HELP: &str = "\
Durations are a number and a unit: 500ms, 10s, 1.5s, 2m, 1h. A bare number is refused
(seconds or milliseconds?), except 0 for --wait and --restart-guard.

The child sees FERROLOCK_KEY (the key), FERROLOCK_TOKEN (the random value stored at the key
while it holds the lock; with --reentrant, --read or --write the owner's field in the key's
hash, and for a semaphore its permit id in hex, as `ferrolock inspect` shows them),
FERROLOCK_FENCE (with --fence: the grant's fencing token, to pass to storage that rejects
stale writers; unset without --fence, even when an enclosing run set it), FERROLOCK_NODES (with --nodes, the list as given; else the caller's own, if set) and
FERROLOCK_HELD (the locks held by this and every enclosing `ferrolock run`, one per line:
nodes, a tab, the key, and for a semaphore a tab and `semaphore COUNT/PERMITS`; a backslash,
tab, newline or carriage return in the nodes or the key is written \\\\, \\t, \\n or \\r).
A nested `ferrolock run` on a key an enclosing one holds on the same servers (h:1 and H:1/0
alike, and localhost, 127.0.0.1 and [::1]) fails at once (exit 64) instead of waiting for
itself; on a semaphore, a nested run is one more holder, and fails so when the enclosing runs
hold the name as a lock, or leave fewer permits than it asks for.

Renewal: the watchdog renews the lock every ttl/3 while COMMAND runs. If the lock is lost
(the key was deleted or taken, or a majority of nodes could not be reached in time), COMMAND
and everything in its process group get SIGTERM before the lock's validity ends, then
SIGKILL when it ends (or after --grace) if any of them is still running (ferrolock waits for the whole group,
not only COMMAND), and ferrolock exits 70 whatever COMMAND's status. It exits 70 too when
the release finds the lock no longer ours (deleted or taken over while COMMAND ran, and not
noticed before COMMAND ended). --max-hold ends the renewals after that long, and COMMAND is
stopped as for a lost lock.

With --no-watchdog the lock lasts --ttl (minus a clock-drift allowance of 1% + 2ms):
ferrolock warns on stderr when that validity ends while COMMAND still runs, but does not
stop COMMAND, and passes its status on (70 only if the release finds the key deleted or
taken before the validity ended). With --no-watchdog and --max-hold, COMMAND is stopped
instead, as for a lost lock (exit 70): at --max-hold, or just before the validity ends,
whichever comes first.

COMMAND runs in a process group of its own. If ferrolock is killed, COMMAND is killed too
(SIGKILL; what COMMAND started itself is not). Signals: SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and
SIGUSR2 sent to ferrolock are forwarded to COMMAND's process group, and SIGINT as well (one
ferrolock was started with ignored, as under nohup, stays ignored, by COMMAND too); when
ferrolock runs in the foreground of a terminal (from its start, or once `fg` brings it there;
not as `ferrolock run ... &` in a script, started with SIGINT ignored, whose terminal stays the
script's), COMMAND gets the terminal's foreground, so Ctrl-C and Ctrl-Z reach it directly
(and the commands beside ferrolock in a pipeline lose the terminal meanwhile: a pager reading
keys, as in `ferrolock run KEY -- make | less`, is stopped; run the whole pipeline as COMMAND,
`ferrolock run KEY -- sh -c 'make | less'`);
if COMMAND dies of a SIGINT while it has the terminal, ferrolock releases the lock and then
sends SIGINT to its own process group, as the terminal would have without it (a
shell script running ferrolock in a loop stops; its status is 130 either way); when that
SIGINT was one sent to ferrolock and forwarded, ferrolock ends of it alone (the script goes on,
as after a `kill -INT` of COMMAND). Ctrl-Z (or
COMMAND reading the terminal from the background) stops COMMAND and ferrolock with it, and
after a Ctrl-Z the group that started ferrolock too (a shell script running it), so the
shell gets the terminal back; the lock is not renewed while stopped. A SIGTSTP sent to
ferrolock itself goes to COMMAND's process group, and ferrolock stops once COMMAND has (one
that ignores it runs on, and ferrolock renews its lock). `fg`, `bg` or a SIGCONT to ferrolock
continues both; if the lock's validity ended meanwhile (watchdog on, or --max-hold),
COMMAND gets SIGTERM before it is continued, and ferrolock exits 70. ferrolock releases the
lock once COMMAND has exited. What COMMAND leaves running in the background when it exits
normally is not covered by the lock: ferrolock neither waits for it nor stops it. A signal
that arrives while ferrolock is still waiting for the lock ends the wait, and COMMAND never
runs; a Ctrl-C at the terminal then ends ferrolock by its SIGINT, so that a shell script
running it stops too.

Exit status:
  COMMAND's exit status, or 128+N when COMMAND was killed by signal N
  64      bad usage or bad input (the message names the bad value)
  69      no quorum of nodes reachable, or Redis refused the commands
  70      the lock was lost before COMMAND finished (COMMAND was stopped if still running),
          or ferrolock itself failed (the message says how)
  75      the lock was not acquired within --wait
  126     COMMAND could not be executed (the lock is released)
  127     COMMAND was not found (the lock is released)
  128+N   ferrolock got signal N while still waiting for the lock
COMMAND's own status can collide with these (a COMMAND that exits 75 looks like a timeout);
when ferrolock itself fails it always prints a \"ferrolock: ...\" line on stderr.";

/// Each mode's own arguments: clap's generated usage would put every required argument of the
/// misused flag's mode on one line (KEY included for a semaphore, which takes none).
const USAGE: &str = "\
ferrolock run [OPTIONS] [--read | --write] <KEY> [--] <COMMAND>...
       ferrolock run [OPTIONS] --semaphore <NAME> --permits <N> [--count <K>] [--] <COMMAND>...";

#[derive(clap::Args)]
#[command(after_long_help = AFTER_HELP, override_usage = USAGE)]
pub struct RunArgs {
    /// Comma-separated node URLs (redis://, rediss://, unix://, redis+cluster://,
    /// rediss+cluster://); more than one means Redlock, held on a majority [default:
    /// $FERROLOCK_NODES, else redis://127.0.0.1:6379]
    // Not clap's `env`: the core resolves FERROLOCK_NODES itself (set but empty, it is refused
    // there), and clap would print the variable's value, passwords included, in --help.
    #[arg(long, value_name = "URLS")]
    nodes: Option<String>,

    /// Lease on each node (at least 100ms), renewed every ttl/3 while COMMAND runs [default: 10s]
    // Hyphen values reach our parser, so `--ttl -1s` is named as a bad duration rather than
    // reported as an unknown flag `-1`.
    #[arg(long, value_name = "DURATION", value_parser = parse_positive, allow_hyphen_values = true)]
    ttl: Option<Duration>,

    /// Give up after this long if the lock is held elsewhere; 0 tries once
    /// [default: wait until acquired]
    #[arg(long, value_name = "DURATION", value_parser = parse_or_zero, allow_hyphen_values = true)]
    wait: Option<Duration>,

    /// Mean pause between attempts while waiting, jittered ±50% [default: 100ms]
    #[arg(long, value_name = "DURATION", value_parser = parse_positive, allow_hyphen_values = true)]
    retry_delay: Option<Duration>,

    /// Per node, per request; 2 × it must be under ttl/3 [default: min(200ms, ttl/10)]
    #[arg(long, value_name = "DURATION", value_parser = parse_positive, allow_hyphen_values = true)]
    node_timeout: Option<Duration>,

    /// Clock drift allowance: drift = ttl × factor + 2ms [default: 0.01]
    #[arg(long, value_name = "FACTOR", allow_hyphen_values = true)]
    drift_factor: Option<String>,

    /// Stop renewing (and stop COMMAND as for a lost lock) after this long [default: none]
    #[arg(long, value_name = "DURATION", value_parser = parse_positive, allow_hyphen_values = true)]
    max_hold: Option<Duration>,

    /// Cap on extensions (none are made by `run`; kept for the options table) [default: none]
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    max_extensions: Option<String>,

    /// Do not renew: the lock lasts --ttl, and ferrolock warns when it ends while COMMAND runs
    /// (with --max-hold: stops COMMAND before it ends)
    #[arg(long)]
    no_watchdog: bool,

    /// Take a Redisson-compatible (hash) lock instead of a plain one (with --read or --write
    /// it changes nothing: a read-write lock is reentrant for its owner anyway)
    // Accepted there, not refused, as every binding accepts reentrant on a read-write lock.
    #[arg(long)]
    reentrant: bool,

    /// Fence the grant and export its token as FERROLOCK_FENCE [also: --fence]
    #[arg(long)]
    fencing: bool,

    // `--fencing` under its short name, an arg of its own rather than an alias: clap names an
    // alias by the arg's own name, so `--fence` with `--semaphore` was refused as a conflict
    // with `--fencing`, a flag the user never typed.
    #[arg(long, hide = true)]
    fence: bool,

    /// Window after a node's (re)start in which its vote does not count; 0 = off
    /// [default: the lease, --ttl, with 3 nodes or more, else off]
    #[arg(long, value_name = "DURATION", value_parser = parse_or_zero, allow_hyphen_values = true)]
    restart_guard: Option<Duration>,

    /// On a Redis Cluster 7.0+, wake-ups over sharded pub/sub (`on`), or classic (`off`, for
    /// Redisson clients with shardedSubscriptionMode OFF) [default: on]
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    sharded_pubsub: Option<bool>,

    /// CA file for rediss:// nodes [default: $FERROLOCK_TLS_CA, else the system roots]
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<String>,

    /// Between SIGTERM and SIGKILL when the lock is lost [default: until the lock's validity
    /// ends: past it another holder may run]
    #[arg(long, value_name = "DURATION", value_parser = parse_positive, allow_hyphen_values = true)]
    grace: Option<Duration>,

    /// Print nothing but errors (no warnings)
    #[arg(long, short, conflicts_with = "verbose")]
    pub(crate) quiet: bool,

    /// Say when the lock is acquired and released, on stderr (renewals are not reported)
    #[arg(long, short)]
    verbose: bool,

    /// At exit, print this process's lock metrics (Prometheus text format) on stderr
    #[arg(long)]
    stats: bool,

    /// KEY is a read-write lock and COMMAND holds its read side, beside other readers
    /// (Redisson's RReadWriteLock layout; a --ttl above 30s is refused)
    #[arg(long, conflicts_with = "write")]
    read: bool,

    /// KEY is a read-write lock and COMMAND holds its write side, alone
    #[arg(long)]
    write: bool,

    /// Instead of KEY: COMMAND holds permits of the semaphore NAME, so at most --permits such
    /// runs go at once (Redisson's RPermitExpirableSemaphore layout; one node only)
    #[arg(
        long,
        value_name = "NAME",
        // One that is not UTF-8 is refused by `usage_error`, naming the flag.
        value_parser = parse_name,
        requires = "permits",
        conflicts_with_all = ["read", "write", "reentrant", "fencing", "fence"]
    )]
    semaphore: Option<String>,

    /// The semaphore's pool size, set by its first holder (a different size later is refused)
    // Hyphen values reach the number parser, so `--permits -1` is named as a bad value.
    #[arg(
        long,
        value_name = "N",
        requires = "semaphore",
        value_parser = parse_at_least_one,
        allow_hyphen_values = true
    )]
    permits: Option<u32>,

    /// How many of the semaphore's permits this run takes [default: 1]
    #[arg(
        long,
        value_name = "K",
        requires = "semaphore",
        value_parser = parse_at_least_one,
        allow_hyphen_values = true
    )]
    count: Option<u32>,

    /// The lock's name: the Redis key that holds it (not given with --semaphore)
    // Checked in `settle_key`, not by a value parser: with --semaphore this is COMMAND's first
    // word, which an empty (or non-UTF-8) value does not make bad usage.
    #[arg(value_name = "KEY", required_unless_present = "semaphore")]
    key_arg: Option<OsString>,

    /// KEY, or --semaphore's NAME (`settle_key`).
    #[arg(skip)]
    key: String,

    /// The program to run under the lock, and its arguments (put `--` before it so that its
    /// options are not read as ferrolock's)
    #[arg(
        value_name = "COMMAND",
        required_unless_present = "semaphore",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

/// A number of permits: clap's own u32 parser said "not in 0..=4294967295" for -1, and 0 was
/// then refused after all.
fn parse_at_least_one(text: &str) -> Result<u32, String> {
    let text = text.trim();
    let too_large = || format!("must be at most {}", u32::MAX);
    match text.parse::<i128>() {
        Ok(n) if n < 1 => Err("must be at least 1".into()),
        Ok(n) => u32::try_from(n).map_err(|_| too_large()),
        // Digits beyond i128: a whole number still, just far out of range.
        Err(_) => match text.strip_prefix(['-', '+']).unwrap_or(text) {
            digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                Err(if text.starts_with('-') {
                    "must be at least 1".into()
                } else {
                    too_large()
                })
            }
            _ => Err("not a whole number".into()),
        },
    }
}

/// A countdown as a message shows it: whole milliseconds (`9.895s`, `5s`), not the
/// nanoseconds of the instant it was computed at (`9.895963407s`).
/// What a lost lock's job gets: SIGTERM, and SIGKILL after `grace` (none left: at once, not
/// "SIGKILL in 0ns").
fn kill_plan(grace: Duration) -> String {
    let grace = whole_ms(grace);
    if grace.is_zero() {
        "SIGTERM and SIGKILL now (its validity has ended)".to_string()
    } else {
        format!("SIGTERM now, SIGKILL in {grace:?} (when its validity ends, unless --grace)")
    }
}

fn whole_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn parse_positive(text: &str) -> Result<Duration, Error> {
    // A bare `0` is refused as the zero it is (as `0s` is), not for its missing unit: with
    // one added it would only be refused again.
    let d = parse_or_zero(text)?;
    if d.is_zero() {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            "must be greater than zero",
        ));
    }
    Ok(d)
}

/// A bare `0` is the one number without a unit that cannot be misread.
fn parse_or_zero(text: &str) -> Result<Duration, Error> {
    if text.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    ferrolock::parse_duration(text)
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" => Ok(true),
        "off" | "false" => Ok(false),
        _ => Err(format!("{text:?}: expected on or off")),
    }
}

fn parse_key(text: &str) -> Result<String, &'static str> {
    if text.is_empty() {
        return Err("the lock key must not be empty");
    }
    Ok(text.to_string())
}

/// `--semaphore`'s NAME: as the core's errors, and every binding's, call it.
fn parse_name(text: &str) -> Result<String, &'static str> {
    if text.is_empty() {
        return Err("the semaphore name must not be empty");
    }
    Ok(text.to_string())
}

impl RunArgs {
    /// What this run holds, for its messages: `semaphore "NAME"`, `read lock "KEY"`,
    /// `write lock "KEY"` or `lock "KEY"`.
    fn held(&self) -> String {
        let noun = match (&self.semaphore, self.read, self.write) {
            (Some(_), ..) => "semaphore",
            (_, true, _) => "read lock",
            (_, _, true) => "write lock",
            _ => "lock",
        };
        format!("{noun} {}", ferrolock::quoted_key(&self.key))
    }

    /// Sets `key`: KEY, or --semaphore's NAME. With --semaphore there is no KEY, but clap
    /// still fills the first positional, so what it read as KEY is COMMAND's first word.
    fn settle_key(&mut self) -> Result<(), String> {
        match (&self.semaphore, self.key_arg.take()) {
            (Some(name), first) => {
                self.key = name.clone();
                if let Some(word) = first {
                    // Every word after `--` is COMMAND's: when they are all in `command`, this
                    // one came before `--`, a KEY that --semaphore does not take (it was run as
                    // the command, after the permit was taken).
                    let raw: Vec<OsString> = std::env::args_os().collect();
                    let after_dashes = raw
                        .iter()
                        .position(|a| a == "--")
                        .map(|at| raw.len() - at - 1);
                    if after_dashes == Some(self.command.len()) {
                        // Quoted as the library quotes keys: a long one by its start and length.
                        let shown = word
                            .to_str()
                            .map_or_else(|| format!("{word:?}"), ferrolock::quoted_key);
                        return Err(format!(
                            "{shown} before `--`: --semaphore NAME takes no KEY (the semaphore is {})",
                            ferrolock::quoted_key(name)
                        ));
                    }
                    self.command.insert(0, word);
                }
            }
            (None, key) => {
                let key = key.unwrap_or_default();
                let key = crate::key_text(&key)?;
                self.key = parse_key(key)?;
            }
        }
        if self.command.is_empty() {
            return Err("COMMAND is missing: give it after `--`".into());
        }
        Ok(())
    }
}

pub fn main(mut args: RunArgs) -> u8 {
    if let Err(message) = args.settle_key() {
        return fail(exit::USAGE, format_args!("{message}"));
    }
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
    let stats = args.stats;
    let code = runtime.block_on(run(args));
    if stats {
        errprint!("{}", ferrolock::metrics::prometheus_text());
    }
    // Only when COMMAND's own status is passed on: a 70 (the lock lost) must stay a 70.
    if PASS_ON_SIGINT.load(std::sync::atomic::Ordering::SeqCst) && code == 128 + libc::SIGINT as u8
    {
        // The lock is released: end as the terminal's Ctrl-C would have ended us, with the
        // group that started us (a shell script then stops instead of going on).
        // SAFETY: plain syscalls; the default action ends the process.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::kill(0, libc::SIGINT);
        }
    }
    // As above: a 70 (the lock lost) stays a 70.
    if DIE_OF_SIGINT.load(std::sync::atomic::Ordering::SeqCst) && code == 128 + libc::SIGINT as u8 {
        // The group has had the terminal's SIGINT already: only we end by it (status 130 to
        // a shell all the same), so that the script that runs us stops as it would for any
        // other command.
        // SAFETY: plain syscalls; the default action ends the process.
        unsafe {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::kill(libc::getpid(), libc::SIGINT);
        }
    }
    code
}

fn fail(code: u8, message: std::fmt::Arguments<'_>) -> u8 {
    errln!("ferrolock: {message}");
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

/// The signals passed on to COMMAND. One we were started with ignored (`nohup`, or a shell's
/// background job for SIGINT and SIGQUIT) is left ignored, so that COMMAND inherits the
/// ignore too: a handler here replaced it, COMMAND was exec'd with the default action, and
/// the SIGHUP of a closing terminal, forwarded, killed the job nohup was meant to keep.
struct Signals {
    int: Option<Signal>,
    term: Option<Signal>,
    hup: Option<Signal>,
    // Their default action would end us at once: COMMAND then died of SIGKILL (no graceful
    // stop on a container's STOPSIGNAL SIGQUIT) and the lock stayed held until its ttl.
    quit: Option<Signal>,
    usr1: Option<Signal>,
    usr2: Option<Signal>,
}

impl Signals {
    fn install() -> io::Result<Signals> {
        let handle = |kind: SignalKind| -> io::Result<Option<Signal>> {
            if ignored(kind.as_raw_value()) {
                return Ok(None);
            }
            signal(kind).map(Some)
        };
        Ok(Signals {
            int: handle(SignalKind::interrupt())?,
            term: handle(SignalKind::terminate())?,
            hup: handle(SignalKind::hangup())?,
            quit: handle(SignalKind::quit())?,
            usr1: handle(SignalKind::user_defined1())?,
            usr2: handle(SignalKind::user_defined2())?,
        })
    }

    /// The next SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2. tokio keeps delivering
    /// after a `recv` completes, so this can be called again and again (a second Ctrl-C is
    /// forwarded too).
    async fn next(&mut self) -> libc::c_int {
        tokio::select! {
            _ = recv(&mut self.int) => libc::SIGINT,
            _ = recv(&mut self.term) => libc::SIGTERM,
            _ = recv(&mut self.hup) => libc::SIGHUP,
            _ = recv(&mut self.quit) => libc::SIGQUIT,
            _ = recv(&mut self.usr1) => libc::SIGUSR1,
            _ = recv(&mut self.usr2) => libc::SIGUSR2,
        }
    }
}

/// The next delivery of a handled signal; never, for one left ignored.
async fn recv(signal: &mut Option<Signal>) {
    match signal {
        Some(s) => {
            s.recv().await;
        }
        None => std::future::pending().await,
    }
}

/// Whether `sig` is ignored in this process (as we were started with it).
fn ignored(sig: libc::c_int) -> bool {
    // SAFETY: sigaction only reads the disposition into `old`, plain data.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The options from the flags, set through the core's options table (so every value is
/// checked, and named in the error, as in every other binding).
fn manager_options(args: &RunArgs) -> Result<ManagerOptions, Error> {
    use ferrolock::OptionValue as V;
    let mut o = ManagerOptions::new();
    let nodes = args.nodes.as_deref().map(ferrolock::split_nodes);
    o.set(
        "nodes",
        nodes.map_or(V::None, V::List),
        args.nodes.as_deref().unwrap_or(""),
    )?;
    let durations = [
        ("ttl", args.ttl),
        ("retry_delay", args.retry_delay),
        ("node_timeout", args.node_timeout),
        ("max_hold", args.max_hold),
    ];
    for (name, value) in durations {
        if let Some(d) = value {
            o.set(name, V::Duration(d), &format!("{d:?}"))?;
        }
    }
    // `None` is a value of these (block until acquired; the default guard).
    o.set("wait", args.wait.map_or(V::None, V::Duration), "")?;
    if let Some(g) = args.restart_guard {
        o.set("restart_guard", V::Duration(g), &format!("{g:?}"))?;
    }
    if let Some(text) = &args.drift_factor {
        let f = text.trim().parse().map_err(|_| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("--drift-factor {text:?}: not a number"),
            )
        })?;
        o.set("drift_factor", V::Number(f), text)?;
    }
    if let Some(text) = &args.max_extensions {
        let digits = text.trim();
        let n = digits.parse().map_err(|_| {
            // Digits past u64 are a count too large, as one past u32 is (the core's limit).
            let why = if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                format!("too large (at most {})", u32::MAX)
            } else {
                "not a non-negative integer".to_string()
            };
            Error::new(
                ErrorKind::InvalidArgument,
                format!("--max-extensions {text:?}: {why}"),
            )
        })?;
        o.set("max_extensions", V::Count(n), text)?;
    }
    o.set("watchdog", V::Bool(!args.no_watchdog), "")?;
    o.set("reentrant", V::Bool(args.reentrant), "")?;
    o.set("fencing", V::Bool(args.fencing || args.fence), "")?;
    if let Some(on) = args.sharded_pubsub {
        o.set("sharded_pubsub", V::Bool(on), "")?;
    }
    if let Some(path) = &args.tls_ca {
        o.set("tls_ca", V::Text(path.clone()), path)?;
    }
    o.lock.validate()?;
    Ok(o)
}

/// The `FERROLOCK_HELD` line of a lock: the node list (passwords redacted), a tab, the key,
/// each escaped: a key may hold a tab or a newline, which would cut the line elsewhere (a
/// nested run on `a\nb` waited for itself; a key `x\n<nodes>\tb` refused an unheld `b`). A
/// semaphore's line ends with a tab and `semaphore COUNT/PERMITS`, what a nested run on it
/// needs to tell whether it would wait for itself.
fn held_entry(manager: &LockManager, key: &str, semaphore: Option<Permits>) -> String {
    let mut line = format!(
        "{}\t{}",
        escape_held(&manager.node_names().join(",")),
        escape_held(key)
    );
    if let Some((count, permits)) = semaphore {
        line.push_str(&format!("\tsemaphore {count}/{permits}"));
    }
    line
}

/// `\`, tab, newline and carriage return written as `\\`, `\t`, `\n`, `\r`: one-to-one, so
/// two lines are equal exactly when what they name is.
fn escape_held(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

/// `escape_held` undone (a `\` before anything else is kept as it is).
fn unescape_held(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// A semaphore hold: how many permits, of how many.
type Permits = (u32, u32);

/// A `FERROLOCK_HELD` line read back: the servers (sorted, as `same_lock` compares them),
/// the key as written (escaped), and a semaphore's count and permits (`None` for a lock, or a
/// field this version does not know).
fn parse_held(line: &str) -> Option<(Vec<String>, &str, Option<Permits>)> {
    let mut fields = line.split('\t');
    let (nodes, key) = (fields.next()?, fields.next()?);
    // Parsed as written: an escaped `\` would be another unix socket path to redis-rs.
    let mut servers: Vec<String> = unescape_held(nodes)
        .split(',')
        .map(|url| ferrolock::server_address(url).unwrap_or_else(|| url.to_string()))
        .collect();
    servers.sort();
    let semaphore = fields
        .next()
        .and_then(|f| f.strip_prefix("semaphore "))
        .and_then(|f| f.split_once('/'))
        .and_then(|(c, p)| Some((c.parse().ok()?, p.parse().ok()?)));
    Some((servers, key, semaphore))
}

/// Whether two `FERROLOCK_HELD` lines name one lock: the same key on the same servers and
/// databases, however their URLs are written (`h:1` and `H:1/0`, in any order; `h:1/3` is
/// another database, so another lock). A URL that does not parse as a standalone node
/// compares as written.
fn same_lock(a: &str, b: &str) -> bool {
    match (parse_held(a), parse_held(b)) {
        (Some((sa, ka, _)), Some((sb, kb, _))) => sa == sb && ka == kb,
        _ => a == b,
    }
}

/// Why this run, nested in runs that hold `enclosing` lines, would wait for itself; `None`
/// when it would not. A lock (or a side of a read-write lock) waits for any enclosing hold of
/// its key; a semaphore waits for an enclosing lock on its name, and for enclosing holds of
/// its own permits when fewer are left than it asks for. (Permits that differ from the
/// enclosing runs' are refused by the core, by name, without a wait.)
fn waits_for_itself(enclosing: &str, here: &str, semaphore: Option<Permits>) -> Option<String> {
    let held: Vec<Option<Permits>> = enclosing
        .lines()
        .filter(|l| same_lock(l, here))
        .map(|l| parse_held(l).and_then(|(_, _, s)| s))
        .collect();
    if held.is_empty() {
        return None;
    }
    let Some((count, permits)) = semaphore else {
        return Some("is already held by an enclosing `ferrolock run`".to_string());
    };
    if held.iter().any(Option::is_none) {
        return Some(
            "is held as a lock by an enclosing `ferrolock run`, and a semaphore waits for it"
                .to_string(),
        );
    }
    if held.iter().flatten().any(|&(_, p)| p != permits) {
        return None;
    }
    let taken: u32 = held.iter().flatten().map(|&(c, _)| c).sum();
    (count > permits.saturating_sub(taken)).then(|| {
        format!(
            "has {taken} of its {permits} permits held by enclosing `ferrolock run`s, and this run asks for {count}"
        )
    })
}

/// The lock, the side of the read-write lock `--read` / `--write` asks for, or the permits of
/// `--semaphore`: the same `Lock`, renewed and watched for loss alike.
async fn acquire(
    manager: &LockManager,
    args: &RunArgs,
    opts: &ferrolock::LockOptions,
) -> ferrolock::Result<Lock> {
    if let Some(permits) = args.permits {
        let count = args.count.unwrap_or(1);
        return manager
            .semaphore_with(&args.key, permits, count, opts)
            .await;
    }
    match (args.read, args.write) {
        (true, _) => manager.read_lock_with(&args.key, opts).await,
        (_, true) => manager.write_lock_with(&args.key, opts).await,
        _ => manager.acquire_with(&args.key, opts).await,
    }
}

async fn run(args: RunArgs) -> u8 {
    let options = match manager_options(&args) {
        Ok(o) => o,
        Err(e) => return fail_with(&e),
    };
    let opts = options.lock.clone();
    // Built inside the runtime, so the manager spawns its background work (the watchdog, a
    // release whose caller went away) on this runtime rather than starting one of its own.
    let manager = match LockManager::new(options) {
        Ok(m) => m,
        Err(e) => return fail_with(&e),
    };
    let semaphore = args.permits.map(|p| (args.count.unwrap_or(1), p));
    let held_here = held_entry(&manager, &args.key, semaphore);
    let enclosing = std::env::var("FERROLOCK_HELD").unwrap_or_default();
    if let Some(why) = waits_for_itself(&enclosing, &held_here, semaphore) {
        return fail(
            exit::USAGE,
            format_args!(
                "{} on {} {why}: waiting for it would wait for ourselves",
                args.held(),
                manager.node_names().join(",")
            ),
        );
    }
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
        r = acquire(&manager, &args, &opts) => Ok(r),
        sig = signals.next() => Err(sig),
    };
    let lock = match acquired {
        Ok(Ok(lock)) => lock,
        Ok(Err(e)) => return fail_with(&e),
        Err(sig) => {
            // The dropped acquire hands its partial grants to a background release on this
            // runtime; returning at once would drop the runtime with that release unfinished.
            tokio::time::sleep(opts.effective_node_timeout() + Duration::from_millis(50)).await;
            if sig == libc::SIGINT && child::foreground_of_terminal() {
                // The terminal's Ctrl-C reached the group that started us as well: a bash
                // running us from a script goes on with it unless we die of the SIGINT (an
                // exit status says the program handled it on purpose). `main` ends so.
                DIE_OF_SIGINT.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            return fail(
                128 + sig as u8,
                format_args!(
                    "interrupted by {} while waiting for {}",
                    signal_name(sig),
                    args.held()
                ),
            );
        }
    };
    if args.verbose {
        errln!(
            "ferrolock: acquired {} (validity {:?}{})",
            args.held(),
            // Whole milliseconds: the nanoseconds of a clock reading are noise here.
            Duration::from_millis(lock.validity().as_millis() as u64),
            lock.fence()
                .map(|f| format!(", fence {f}"))
                .unwrap_or_default()
        );
    }

    let mut held = enclosing;
    if !held.is_empty() && !held.ends_with('\n') {
        held.push('\n');
    }
    held.push_str(&held_here);
    let mut env = vec![
        ("FERROLOCK_KEY", args.key.clone()),
        ("FERROLOCK_TOKEN", lock.token().to_string()),
        ("FERROLOCK_HELD", held),
    ];
    if let Some(nodes) = &args.nodes {
        env.push(("FERROLOCK_NODES", nodes.clone()));
    }
    if let Some(fence) = lock.fence() {
        env.push(("FERROLOCK_FENCE", fence.to_string()));
    }
    let code = supervise(&args, &lock, &env, &mut signals).await;
    // A lock that is renewed or cut short (`max_hold`) has its loss signalled; one declared
    // as COMMAND exited may have lost the race with that exit in `supervise`.
    let watched = !args.no_watchdog || args.max_hold.is_some();
    let mut lost = match lock.status() {
        LockStatus::Lost(reason) if watched && code != exit::LOST => {
            let text = reason.to_string();
            let prefix = format!("lock {:?} lost: ", args.key);
            Some(text.strip_prefix(&prefix).unwrap_or(&text).to_string())
        }
        _ => None,
    };
    match lock.release().await {
        Ok(true) => {
            if args.verbose {
                errln!("ferrolock: released {}", args.held());
            }
        }
        // A loss was reported when it happened.
        Ok(false) if code == exit::LOST => {}
        // --no-watchdog: the validity ended while COMMAND ran, as the warning said then; its
        // status is passed on (see the help).
        Ok(false) if !watched && Instant::now() >= lock.deadline() => {}
        Ok(false) => {
            lost.get_or_insert_with(|| {
                format!(
                    "our token was gone at release: the key was deleted or taken over while {} ran",
                    program(&args)
                )
            });
        }
        Err(e) if !args.quiet || e.kind() != ErrorKind::NotHeld => {
            errln!("ferrolock: warning: {e} [{}]", e.kind().code())
        }
        Err(_) => {}
    }
    if let Some(why) = lost {
        // As for a loss while COMMAND ran: its status would hide that part of it ran
        // without the lock.
        return fail(
            exit::LOST,
            format_args!(
                "{} was lost before {} finished: {why}",
                args.held(),
                program(&args)
            ),
        );
    }
    code
}

/// Runs the child to completion while forwarding signals and watching the lock. Returns the
/// exit code to pass on: the child's, or `LOST` when the lock was lost while it ran.
async fn supervise(
    args: &RunArgs,
    lock: &Lock,
    env: &[(&str, String)],
    signals: &mut Signals,
) -> u8 {
    // Before the spawn, so that no stop of the child goes unseen (see `job_stop`).
    let mut sigchld = signal(SignalKind::child()).ok();
    // A shell's `fg` continues the job it brings to the foreground (see `hand_terminal`).
    let mut sigcont = signal(SignalKind::from_raw(libc::SIGCONT)).ok();
    // `kill -TSTP` sent to us alone (the terminal's Ctrl-Z reaches the child's group): its
    // default action stopped us and not the child, which ran on with its lock no longer
    // renewed. It goes to the child's group, and we stop once the child has (see `job_stop`).
    // Left alone if we were started with it ignored.
    let mut sigtstp = if ignored(libc::SIGTSTP) {
        None
    } else {
        signal(SignalKind::from_raw(libc::SIGTSTP)).ok()
    };
    // A run that takes no fence (no --fence, a semaphore) nested in one that did would pass
    // the enclosing lock's fence on, read by COMMAND as its own key's.
    let unset: &[&str] = if lock.fence().is_none() {
        &["FERROLOCK_FENCE"]
    } else {
        &[]
    };
    let mut child = match child::spawn(&args.command, env, unset) {
        Ok(child) => child,
        Err(e) => {
            let code = if e.kind() == io::ErrorKind::NotFound {
                exit::NOT_FOUND
            } else {
                exit::CANNOT_EXECUTE
            };
            return fail(code, format_args!("cannot run {:?}: {e}", program(args)));
        }
    };
    let watchdog = !args.no_watchdog;
    // Without the watchdog (and no max_hold) nothing renews: the deadline warning below is
    // all there is, and nobody listens for an `Expiring` loss.
    let watched = watchdog || args.max_hold.is_some();
    let mut lost = watched.then(|| Box::pin(lock.lost()));
    let deadline = lock.deadline();
    // SIGKILL by default when the validity ends: past it another holder may run, so the job
    // must not (one that needs longer to stop asks for it with --grace, best with --fence).
    let kill_after = |now: Instant| {
        args.grace
            .unwrap_or_else(|| lock.deadline().saturating_duration_since(now))
    };
    let mut warned = false;
    // A SIGINT sent to us, passed on: the child may die of it with the terminal in hand,
    // and none has reached the group that started us (see below).
    let mut forwarded_sigint = false;
    // Likewise a SIGTSTP sent to us, and passed on, until the child's stop is seen.
    let mut forwarded_sigtstp = false;
    let mut loss: Option<String> = None;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            status = child.process.wait() => break status,
            sig = signals.next() => {
                forwarded_sigint |= sig == libc::SIGINT;
                forward(sig, &child);
            }
            _ = async { sigchld.as_mut().expect("guarded").recv().await }, if sigchld.is_some() => {
                let Some(sig) = child.job_stop() else { continue };
                // Ctrl-Z (or a read of the terminal from the background) stopped the child:
                // we stop too, so that our shell gets its terminal and job control back. The
                // lock is not renewed while we are stopped.
                // One we forwarded was sent to us alone: it stops no one else.
                child.stop_with_child(sig, !std::mem::take(&mut forwarded_sigtstp));
                if watched && loss.is_none() && Instant::now() >= lock.deadline() {
                    // Stopped past the validity: the child must not run on without the lock.
                    let now = Instant::now();
                    let grace = kill_after(now);
                    errln!(
                        "ferrolock: {} validity ended while ferrolock was stopped; stopping {} (pid {}): {}",
                        args.held(),
                        program(args),
                        child.pgid,
                        kill_plan(grace)
                    );
                    child.signal_group(libc::SIGTERM);
                    loss = Some("its validity ended while ferrolock was stopped".to_string());
                    kill_at = Some(now + grace);
                }
                child.signal_group(libc::SIGCONT);
            }
            _ = async { sigtstp.as_mut().expect("guarded").recv().await }, if sigtstp.is_some() => {
                forwarded_sigtstp = true;
                child.signal_group(libc::SIGTSTP);
            }
            _ = async { sigcont.as_mut().expect("guarded").recv().await }, if sigcont.is_some() => {
                child.hand_terminal();
            }
            reason = async { lost.as_mut().expect("guarded").await }, if lost.is_some() => {
                lost = None; // resolves once
                // `None`: released, which only we do, after the child is gone.
                let Some(reason) = reason else { continue };
                if loss.is_some() {
                    continue; // stopped already (see the stop above)
                }
                let now = Instant::now();
                let grace = kill_after(now);
                errln!(
                    "ferrolock: {reason}; stopping {} (pid {}): {}",
                    program(args),
                    child.pgid,
                    kill_plan(grace)
                );
                child.signal_group(libc::SIGTERM);
                loss = Some(reason.to_string());
                kill_at = Some(now + grace);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                kill_at = None;
                child.signal_group(libc::SIGKILL);
            }
            _ = tokio::time::sleep_until(deadline), if !watchdog && !warned => {
                warned = true;
                if !args.quiet {
                    errln!(
                        "ferrolock: warning: {} validity ended while {} (pid {}) is still running; another process may now hold it (--ttl {:?}, --no-watchdog)",
                        args.held(),
                        program(args),
                        child.pgid,
                        lock.ttl(),
                    );
                }
            }
        }
    };
    child.restore_terminal();
    if loss.is_some() {
        if let Some(kill_at) = kill_at {
            stop_the_rest(&child, kill_at, signals).await;
        }
        // The child's own status would hide that it ran (and was stopped) without the lock.
        return exit::LOST;
    }
    if child.had_terminal
        && let Ok(status) = &status
        && std::os::unix::process::ExitStatusExt::signal(status) == Some(libc::SIGINT)
    {
        if forwarded_sigint {
            // A SIGINT sent to us (`kill -INT`; or the terminal's, if our group had the
            // foreground, which the group that started us got as well): we end of it alone,
            // as the child did. Passed on to our group, it ended the script that ran us (and
            // its pipeline), which a `kill -INT` of the child itself leaves going on.
            DIE_OF_SIGINT.store(true, std::sync::atomic::Ordering::SeqCst);
        } else {
            // A Ctrl-C at the terminal reached only the child's group, which had the
            // foreground. Without us it would have reached the group that started us too (a
            // shell script's loop stops on it): `main` passes it on there once the lock is
            // released.
            PASS_ON_SIGINT.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    match status {
        Ok(status) => exit_code(status),
        Err(e) => fail(
            exit::SOFTWARE,
            format_args!("lost track of {}: {e}", program(args)),
        ),
    }
}

/// Set when the child died of a SIGINT while it had the terminal (see `supervise`).
static PASS_ON_SIGINT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set when a SIGINT from the terminal ended the wait for the lock (see `run`), or one sent
/// to us killed the child (see `supervise`).
static DIE_OF_SIGINT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// After a loss, once the child has exited: what it started in its process group got the
/// SIGTERM too, and may outlive it (a background job that ignores SIGTERM, or takes longer
/// to stop). Waits until the group is empty, or until `kill_at` (the end of the grace), when
/// what is left gets SIGKILL. Signals sent to us meanwhile go to the group.
async fn stop_the_rest(child: &child::Child, kill_at: Instant, signals: &mut Signals) {
    // The kernel tells no one when a group empties: it is probed.
    let mut probe = tokio::time::interval(Duration::from_millis(50));
    while child.group_alive() {
        tokio::select! {
            _ = probe.tick() => {}
            // We have the terminal back: a SIGINT from it reached us alone.
            sig = signals.next() => child.signal_group(sig),
            _ = tokio::time::sleep_until(kill_at) => {
                child.signal_group(libc::SIGKILL);
                return;
            }
        }
    }
}

/// Passes a signal sent to us on to the child's process group, a SIGINT or SIGQUIT too: the
/// terminal's reach the child's group alone while it has the foreground, so one we get came
/// from elsewhere, or from a terminal whose foreground is ours (after `fg` of a ferrolock
/// started in the background, whose child had no terminal to be given), never to the child.
fn forward(sig: libc::c_int, child: &child::Child) {
    child.signal_group(sig);
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
        libc::SIGHUP => "SIGHUP",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGUSR2 => "SIGUSR2",
        _ => "a signal",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_zero_for_a_positive_duration_is_refused_as_zero_not_for_its_unit() {
        for text in ["0", " 0 ", "0s", "0ms"] {
            let err = parse_positive(text).unwrap_err().to_string();
            assert!(err.contains("must be greater than zero"), "{text:?}: {err}");
        }
        assert!(
            parse_positive("10")
                .unwrap_err()
                .to_string()
                .contains("missing unit")
        );
        assert_eq!(parse_positive("1.5s").unwrap(), Duration::from_millis(1500));
    }

    #[test]
    fn held_lines_escape_one_to_one_and_compare_servers_as_written() {
        for text in ["a\nb", "a\\nb", "a\tb\\", "\\\\t", "plain", "x\r\n"] {
            let escaped = escape_held(text);
            assert!(!escaped.contains(['\n', '\t', '\r']), "{escaped:?}");
            assert_eq!(unescape_held(&escaped), text);
        }
        assert_ne!(escape_held("a\nb"), escape_held("a\\nb"));
        // A backslash in a socket path is compared as the path it is, not doubled.
        let line = |nodes: &str, key: &str| format!("{}\t{}", escape_held(nodes), escape_held(key));
        assert!(same_lock(
            &line("unix:///tmp/a\\b", "k"),
            &line("unix:///tmp/a%5Cb", "k")
        ));
        assert!(!same_lock(
            &line("unix:///tmp/a\\b", "k"),
            &line("unix:///tmp/a%5C%5Cb", "k")
        ));
        assert!(!same_lock(
            &line("redis://h:1", "a\nb"),
            &line("redis://h:1", "a")
        ));
    }

    #[test]
    fn a_nested_semaphore_counts_the_permits_its_enclosing_runs_hold() {
        let sem = |c: u32, p: u32| format!("redis://h:1\ts\tsemaphore {c}/{p}");
        let lock = "redis://h:1\ts";
        // The same lock whatever the third field says.
        assert!(same_lock(&sem(1, 3), lock) && same_lock(&sem(1, 3), &sem(2, 3)));
        let enclosing = [sem(1, 3), sem(1, 3)].join("\n");
        assert!(waits_for_itself(&enclosing, &sem(1, 3), Some((1, 3))).is_none());
        let why = waits_for_itself(&enclosing, &sem(2, 3), Some((2, 3))).unwrap();
        assert!(why.contains("2 of its 3 permits"), "{why}");
        // Another pool size: the core refuses it by name, without a wait.
        assert!(waits_for_itself(&sem(1, 3), &sem(3, 4), Some((3, 4))).is_none());
        // A lock on the name (an older ferrolock's line, with no field, reads as one too).
        assert!(
            waits_for_itself(lock, &sem(1, 3), Some((1, 3)))
                .unwrap()
                .contains("as a lock")
        );
        assert!(
            waits_for_itself(&sem(1, 3), lock, None)
                .unwrap()
                .contains("already held")
        );
        assert!(waits_for_itself("redis://h:1\tother", lock, None).is_none());
    }
}
