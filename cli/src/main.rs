//! `ferrolock`: run a program while holding a distributed lock on Redis.
//!
//! This file only parses arguments and maps outcomes to exit codes; `run.rs` does the work.

/// `eprintln!` that ignores write errors. `eprintln!` panics when stderr is a pipe whose
/// reader has gone (`ferrolock run ... 2>&1 | true`): exit 101 before COMMAND ran, or with the
/// lock still held until its ttl. Every message on stderr goes through this (or `errprint!`).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// `eprint!` that ignores write errors (see `errln!`).
macro_rules! errprint {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = write!(std::io::stderr(), $($arg)*);
    }};
}

mod child;
mod cluster;
mod inspect;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit codes from sysexits.h, so that schedulers and scripts that already know them (cron
/// wrappers, systemd's `RestartPreventExitStatus`) can tell our failures apart.
mod exit {
    /// Bad usage or bad input.
    pub const USAGE: u8 = 64;
    /// No quorum of nodes is reachable, or Redis refused the command.
    pub const UNAVAILABLE: u8 = 69;
    /// A failure that should not happen (a bug, or the OS refusing a runtime or signal handler).
    pub const SOFTWARE: u8 = 70;
    /// The lock was lost while the child ran, and the child was stopped (EX_SOFTWARE's number:
    /// the job did not complete under the lock, which no child status may hide).
    pub const LOST: u8 = 70;
    /// The lock was not acquired within `--wait`.
    pub const TEMPFAIL: u8 = 75;
    /// The command exists but could not be executed (shell convention).
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found (shell convention).
    pub const NOT_FOUND: u8 = 127;
    /// Output could not be written (other than to a closed pipe).
    pub const IOERR: u8 = 74;
    /// Our stdout is a pipe whose reader has gone: the status of a tool killed by SIGPIPE.
    pub const BROKEN_PIPE: u8 = 128 + libc::SIGPIPE as u8;
}

#[derive(Parser)]
#[command(
    name = "ferrolock",
    version,
    about = "Distributed locks over Redis (single instance or Redlock)",
    propagate_version = true,
    subcommand_required = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND while holding the lock KEY (or a read-write lock's side, or permits of a
    /// semaphore), then release it and exit with COMMAND's status.
    Run(Box<run::RunArgs>),
    /// Show who holds KEY on each node: type, holder, hold counts, ttl, fence, waiters.
    Inspect(inspect::InspectArgs),
    /// List keys that look like locks (ferrolock, redis-py, Redisson), flagging leaked ones.
    Scan(inspect::ScanArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return ExitCode::from(usage_error(e)),
    };
    if !matches!(&cli.command, Command::Run(args) if args.quiet) {
        show_core_warnings();
    }
    let code = match cli.command {
        Command::Run(args) => run::main(*args),
        Command::Inspect(args) => inspect::inspect(args),
        Command::Scan(args) => inspect::scan(args),
    };
    ExitCode::from(code)
}

/// The core's own warnings (a node's vote held back by the restart guard, a tuning variable
/// it cannot read), on stderr as ours are: without a sink they went nowhere, and a run on
/// freshly restarted nodes waited without a word. Not the lock module's: `run` reports the
/// fate of the lock it holds itself, with its exit code.
fn show_core_warnings() {
    use ferrolock::host::log::{LogLevel, LogSink, set_sink};
    let sink: LogSink = Box::new(|record| {
        if record.target != "ferrolock::lock" {
            errln!("ferrolock: warning: {}", record.message);
        }
    });
    // Fails only if another subscriber is installed, which this program never does.
    let _ = set_sink(Some(sink), LogLevel::Warn);
}

/// A lock key given on the command line, as text: every lock's names are (the core takes
/// `&str`). The refusal names the key, its bad bytes escaped.
fn key_text(key: &std::ffi::OsStr) -> Result<&str, String> {
    key.to_str().ok_or_else(|| {
        format!(
            "the lock key {} is not UTF-8 (a lock's names are text)",
            shown_raw(key)
        )
    })
}

/// A name that is not UTF-8 as a refusal shows it: its bad bytes escaped, unless it is too
/// long to show whole (an argument may be 128 KiB); then as the library shows a long key, by
/// its start and its length.
fn shown_raw(raw: &std::ffi::OsStr) -> String {
    let long = ferrolock::quoted_key(&raw.to_string_lossy());
    // The library ends a key it shows whole with its quote, a long one with its length.
    if long.ends_with('"') {
        format!("{raw:?}")
    } else {
        long
    }
}

/// `--help` and `--version` succeed; every other clap error is bad usage, which is 64 here
/// rather than clap's 2, because a child's exit code 2 must stay distinguishable from ours.
fn usage_error(e: clap::Error) -> u8 {
    if e.exit_code() == 0 {
        let _ = e.print();
        return 0;
    }
    if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        errprint!("{}", e.render());
        return exit::USAGE;
    }
    if e.kind() == clap::error::ErrorKind::InvalidUtf8
        && let Some((option, value)) = not_utf8_value()
    {
        errprint!(
            "ferrolock: the value of {option} must be UTF-8 text, and {} is not\n\n\
             For more information, try '--help'.\n",
            shown_raw(&value)
        );
        return exit::USAGE;
    }
    let text = e.render().to_string();
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    errprint!("ferrolock: {text}");
    exit::USAGE
}

/// The option given a value that is not UTF-8, as clap shows it (`--nodes <URLS>`), and that
/// value, found on the command line: clap's own refusal ("invalid UTF-8 was detected in one
/// or more arguments") names neither. Names and patterns, taken as bytes, are not options.
fn not_utf8_value() -> Option<(String, std::ffi::OsString)> {
    use clap::CommandFactory as _;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt as _;
    let mut cli = Cli::command();
    // Built, as when parsing: an argument is shown from its built form.
    cli.build();
    let mut args = std::env::args_os().skip(1);
    let sub = cli.find_subcommand(args.next()?.to_str()?)?;
    let option = |name: &[u8]| {
        sub.get_arguments()
            .find(|a| a.get_long().is_some_and(|l| l.as_bytes() == name))
            .filter(|a| a.get_action().takes_values())
            .map(ToString::to_string)
    };
    // An option whose value is the next argument.
    let mut pending: Option<String> = None;
    for arg in args {
        if let Some(option) = pending.take() {
            if arg.to_str().is_none() {
                return Some((option, arg));
            }
            continue;
        }
        let bytes = arg.as_bytes();
        if bytes == b"--" {
            return None;
        }
        let Some(long) = bytes.strip_prefix(b"--") else {
            continue;
        };
        match long.iter().position(|&b| b == b'=') {
            Some(eq) => {
                let value = &long[eq + 1..];
                if std::str::from_utf8(value).is_err()
                    && let Some(option) = option(&long[..eq])
                {
                    return Some((option, OsStr::from_bytes(value).to_os_string()));
                }
            }
            None => pending = option(long),
        }
    }
    None
}
