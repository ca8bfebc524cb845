//! The child of `ferrolock run`: started in a process group of its own (so a lost lock can
//! stop it with everything it started, `sh -c` grandchildren included), tied to our life
//! (PR_SET_PDEATHSIG: if `ferrolock` is killed, the child is killed too rather than running on
//! unprotected), handed the terminal's foreground when we had it (so Ctrl-C still reaches it
//! directly, as it would without us), and signalled as a group.

use std::ffi::OsString;
use std::io;

/// A spawned child and its process group (the same id).
pub struct Child {
    pub process: tokio::process::Child,
    pub pgid: libc::pid_t,
    /// The terminal whose foreground we handed to the child, to take back when it ends.
    terminal: Option<libc::c_int>,
    /// The child has had the terminal's foreground: a Ctrl-C there reached its group alone.
    pub had_terminal: bool,
}

/// Spawns `command` in a new process group with `env` added and `unset` removed.
pub fn spawn(command: &[OsString], env: &[(&str, String)], unset: &[&str]) -> io::Result<Child> {
    let parent = std::process::id() as libc::pid_t;
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).process_group(0);
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    // The terminal, if we are its foreground job: the child takes its foreground itself,
    // before it execs, and we hand it over too (as shells do, in both): a Ctrl-C from its
    // very start then reaches it, whichever of the two runs first.
    let tty = foreground_terminal();
    // SAFETY: only async-signal-safe calls (prctl, getppid, `set_foreground`, _exit) between
    // fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // We died between fork and prctl: the signal would never come.
            if libc::getppid() != parent {
                libc::_exit(129);
            }
            if let Some(fd) = tty {
                // Our new group is a background one.
                set_foreground(fd, libc::getpid());
            }
            Ok(())
        });
    }
    let process = match cmd.spawn() {
        Ok(process) => process,
        Err(e) => {
            if let Some(fd) = tty {
                // SAFETY: a descriptor we own.
                unsafe { libc::close(fd) };
            }
            return Err(e);
        }
    };
    let pgid = process.id().map_or(0, |p| p as libc::pid_t);
    let terminal = tty.and_then(|fd| give_terminal(fd, pgid));
    Ok(Child {
        process,
        pgid,
        had_terminal: terminal.is_some(),
        terminal,
    })
}

impl Child {
    /// Sends `sig` to the child's process group (the child and whatever it started there).
    /// Only while the group id cannot name another group: before the child is reaped (its pid
    /// is the group id, and cannot be reused while it is our unreaped child), or after, while
    /// `group_alive` says the group still has members (Linux keeps a pid number allocated
    /// while any process has it as its group id).
    pub fn signal_group(&self, sig: libc::c_int) {
        if self.pgid > 0 {
            // SAFETY: plain syscall.
            unsafe { libc::kill(-self.pgid, sig) };
        }
    }

    /// Whether any process is left in the child's process group. Meant for after the child
    /// was reaped (before, the child itself counts, zombie or not).
    pub fn group_alive(&self) -> bool {
        if self.pgid <= 0 {
            return false;
        }
        // SAFETY: signal 0 only checks that the group exists and may be signalled.
        let r = unsafe { libc::kill(-self.pgid, 0) };
        if r != 0 {
            // EPERM: a member we may not signal (it changed its user id) is still a member.
            return io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH);
        }
        // A zombie still counts for kill(): under a parent that never reaps its orphans (a
        // container's PID 1 without an init), the group would look alive until --grace ran out.
        live_member(self.pgid).unwrap_or(true)
    }

    /// Takes the terminal's foreground back, once the child is gone.
    pub fn restore_terminal(&mut self) {
        if let Some(fd) = self.terminal.take() {
            take_foreground(fd, self.pgid);
            // SAFETY: a descriptor we own.
            unsafe { libc::close(fd) };
        }
    }

    /// The job-control signal (SIGTSTP, SIGTTIN, SIGTTOU) that stopped the child, if it was
    /// stopped by one since the last call (the stop is consumed; its exit is left for tokio).
    pub fn job_stop(&self) -> Option<libc::c_int> {
        let pid = self.process.id()?;
        // SAFETY: waitid on our own child, WNOHANG; `info` is plain data.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let r = libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WSTOPPED | libc::WNOHANG,
            );
            if r != 0 || info.si_pid() == 0 || info.si_code != libc::CLD_STOPPED {
                return None;
            }
            let sig = info.si_status();
            matches!(sig, libc::SIGTSTP | libc::SIGTTIN | libc::SIGTTOU).then_some(sig)
        }
    }

    /// The child was stopped by `sig` (Ctrl-Z, or reading the terminal from the background):
    /// stops this process the same way, with the terminal taken back, so that the shell that
    /// started us sees its job stopped and takes the terminal (as it would have without us).
    /// Returns once we are continued (`fg`, `bg`), having handed the terminal to the child
    /// again if we are in its foreground; the caller then continues the child. Where nothing
    /// can continue us (an orphaned process group, the signal ignored), the stop does not
    /// happen and this returns at once.
    ///
    /// With `from_terminal` (a Ctrl-Z, as far as we can tell: a SIGTSTP we did not forward)
    /// and the child holding the terminal, the terminal's SIGTSTP reached the child's group
    /// alone: it is passed on to our own group first, which it would have reached without us.
    /// The shell script that runs us then stops too, and its shell sees the job stopped and
    /// takes the terminal back (it waited for the script, which waited for us, for good).
    pub fn stop_with_child(&mut self, sig: libc::c_int, from_terminal: bool) {
        let mut whole_group = false;
        if let Some(fd) = self.terminal {
            take_foreground(fd, self.pgid);
            whole_group = from_terminal && sig == libc::SIGTSTP;
        }
        if whole_group {
            stop_our_group(sig);
        } else {
            raise_default(sig);
        }
        match self.terminal {
            Some(fd) => {
                // SAFETY: tcgetpgrp on a descriptor we own.
                if unsafe { libc::tcgetpgrp(fd) == libc::getpgrp() } {
                    // SAFETY: as in `give_terminal`.
                    unsafe { libc::tcsetpgrp(fd, self.pgid) };
                }
            }
            None => self.hand_terminal(),
        }
    }

    /// Hands the child the terminal's foreground when our group has it and the child does not:
    /// a ferrolock started in the background had none to give at the spawn, and `fg` (which
    /// continues the job: our SIGCONT) gives it to us alone. Without it the terminal's Ctrl-Z
    /// stopped us and not the child, which ran on with its lock no longer renewed.
    pub fn hand_terminal(&mut self) {
        if self.terminal.is_none() {
            self.terminal = foreground_terminal().and_then(|fd| give_terminal(fd, self.pgid));
            self.had_terminal |= self.terminal.is_some();
        }
    }
}

/// Raises `sig` on ourselves with its default action (stop, for the job-control signals),
/// or its inherited ignore: `supervise` handles SIGTSTP (one sent to us alone goes to the
/// child's group), and its handler would catch our own stop. The kernel still discards it
/// where nothing could continue us (an orphaned process group).
fn raise_default(sig: libc::c_int) {
    // SAFETY: sigaction reads and restores our own disposition (plain data); raise on
    // ourselves, delivered to this thread before it returns.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction == libc::SIG_IGN
            || old.sa_sigaction == libc::SIG_DFL
        {
            libc::raise(sig);
            return;
        }
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &default, std::ptr::null_mut());
        libc::raise(sig);
        libc::sigaction(sig, &old, std::ptr::null_mut());
    }
}

/// Sends `sig` to our whole process group, ourselves included, with its default action here
/// (stop) meanwhile, as the terminal would have without us. One kill for the group and us:
/// the script that runs us stopped first, its shell saw the job stopped and continued it
/// (`fg`), and our own stop, raised after, came after that SIGCONT and stopped us for good,
/// with the script waiting for us (a SIGCONT discards a stop sent before it, not one sent
/// after). Not when we were started with it ignored.
fn stop_our_group(sig: libc::c_int) {
    // SAFETY: sigaction reads and restores our own disposition (plain data); kill on our
    // own group, whose stop this thread takes on its way out of the call (the thread that
    // sent it is the one the kernel picks when it is not blocked).
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
            || old.sa_sigaction == libc::SIG_IGN
        {
            return;
        }
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(sig, &default, std::ptr::null_mut());
        libc::kill(0, sig);
        libc::sigaction(sig, &old, std::ptr::null_mut());
    }
}

/// Makes our process group the foreground of `fd` again, if the child's group (`child`) has
/// it: after a `bg` the shell has it, and must keep it. We are in a background group then.
fn take_foreground(fd: libc::c_int, child: libc::pid_t) {
    // SAFETY: tcgetpgrp and `set_foreground` on a descriptor we own.
    unsafe {
        if libc::tcgetpgrp(fd) == child {
            set_foreground(fd, libc::getpgrp());
        }
    }
}

/// tcsetpgrp with SIGTTOU blocked around it: called from a background group it raises
/// SIGTTOU, which would stop the caller (shells block it the same way). Async-signal-safe
/// (sigset calls, pthread_sigmask, tcsetpgrp): it also runs between fork and exec.
///
/// # Safety
/// `fd` is a terminal descriptor the caller owns.
unsafe fn set_foreground(fd: libc::c_int, pgrp: libc::pid_t) {
    // SAFETY: plain libc calls on a zeroed sigset and the caller's descriptor.
    unsafe {
        let mut block: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut block);
        libc::sigaddset(&mut block, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &block, &mut old);
        libc::tcsetpgrp(fd, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.restore_terminal();
    }
}

/// When our process group is the foreground job of our controlling terminal, makes the
/// child's group the foreground instead (the terminal's Ctrl-C then reaches the child, as it
/// would have without us) and returns the terminal to take it back later.
fn give_terminal(fd: libc::c_int, pgid: libc::pid_t) -> Option<libc::c_int> {
    // SAFETY: tcgetpgrp/tcsetpgrp/close on a descriptor we own.
    unsafe {
        // The child may have taken the foreground already (see `spawn`).
        let foreground = libc::tcgetpgrp(fd);
        let handed = pgid > 0
            && (foreground == pgid
                || foreground == libc::getpgrp() && libc::tcsetpgrp(fd, pgid) == 0);
        if !handed {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

/// Our controlling terminal (a descriptor we own, close-on-exec) if our process group is its
/// foreground job and we are not a background command of a shell without job control.
fn foreground_terminal() -> Option<libc::c_int> {
    if background_command() {
        return None;
    }
    // SAFETY: open/tcgetpgrp/close on a descriptor we own.
    unsafe {
        let fd = libc::open(
            c"/dev/tty".as_ptr(),
            libc::O_RDONLY | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return None;
        }
        if libc::tcgetpgrp(fd) != libc::getpgrp() {
            libc::close(fd);
            return None;
        }
        Some(fd)
    }
}

/// Whether we were started as a background command by a shell without job control (`ferrolock
/// run ... &` in a script): it leaves us in its own group, the terminal's foreground, with
/// SIGINT ignored. The terminal is the script's then: handed to the child, the script's reads
/// from it failed (or stopped it) and its Ctrl-C went to the child. SIGINT is still ignored
/// here only if it was at our start (`Signals::install` keeps such an ignore).
fn background_command() -> bool {
    // SAFETY: sigaction only reads the disposition into `old`, plain data.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// True when our process group is the foreground job of our controlling terminal.
pub fn foreground_of_terminal() -> bool {
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

/// Whether group `pgid` still has a running member, from /proc: Some(false) only when every
/// member seen is a zombie and one was seen (which is why kill() found the group); None when
/// /proc cannot tell (unreadable, or another pid namespace's, whose pids are not ours).
fn live_member(pgid: libc::pid_t) -> Option<bool> {
    let me = std::fs::read_link("/proc/self").ok()?;
    if me.to_str()?.parse::<u32>().ok()? != std::process::id() {
        return None;
    }
    let mut zombies = 0;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let mut path = entry.path();
        path.push("stat");
        // Gone meanwhile, or hidden from us (then not ours to kill either): skip it.
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ... num_threads ...": comm may hold spaces and
        // parentheses, so the fields are counted from the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let (Some(&state), Some(pgrp), Some(&threads)) =
            (fields.first(), fields.get(2), fields.get(17))
        else {
            continue;
        };
        if pgrp.parse::<libc::pid_t>().ok() != Some(pgid) {
            continue;
        }
        // A process whose main thread has exited shows Z while its other threads still run.
        if state == "Z" && (threads == "0" || threads == "1") {
            zombies += 1;
        } else {
            return Some(true);
        }
    }
    (zombies > 0).then_some(false)
}
